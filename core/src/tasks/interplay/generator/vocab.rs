//! The three contexts (`docs/interplay.md` §2.4, `simple_names_three.py`) at depth d = 2: a
//! category layer (places, cities, festivals) and an item layer whose totals are the abstract
//! parameters.

/// A problem context ("template").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Template {
    /// Animals in zoos and wild places.
    CrazyZootopia,
    /// Schools in cities.
    TeachersInSchool,
    /// Movies at festivals.
    MovieFestivalAwards,
}

/// One layer of a context: its category name and its named sub-lists, in the reference's
/// dict order.
pub struct Layer {
    /// The layer's category name (for the item layer, the abstract total's name).
    pub category: &'static str,
    /// `(sub-category, names)`; the generator picks one sub-list per problem.
    pub sublists: &'static [(&'static str, &'static [&'static str])],
}

impl Template {
    /// All templates, in the reference's order.
    pub const ALL: [Template; 3] = [
        Template::CrazyZootopia,
        Template::TeachersInSchool,
        Template::MovieFestivalAwards,
    ];

    /// The template's name in rows (`template` field).
    pub fn name(self) -> &'static str {
        match self {
            Template::CrazyZootopia => "crazy_zootopia",
            Template::TeachersInSchool => "teachers_in_school",
            Template::MovieFestivalAwards => "movie_festival_awards",
        }
    }

    /// The two layers: categories (layer 0) and items (layer 1).
    pub fn layers(self) -> [Layer; 2] {
        match self {
            Template::CrazyZootopia => [
                Layer {
                    category: "Location",
                    sublists: &[
                        (
                            "Wild place",
                            &[
                                "Beverly Forest",
                                "Cedar Valley",
                                "Oakridge Riverside",
                                "Pine Ridge",
                                "Maple Creek",
                            ],
                        ),
                        (
                            "Human place",
                            &[
                                "South Zoo",
                                "Jefferson Circus",
                                "Mayer Aquarium",
                                "Bundle Ranch",
                                "Hamilton Farm",
                            ],
                        ),
                    ],
                },
                Layer {
                    category: "total number of adult animals",
                    sublists: &[
                        (
                            "Mammal",
                            &[
                                "adult bear",
                                "adult wolf",
                                "adult deer",
                                "adult fox",
                                "adult racoon",
                            ],
                        ),
                        (
                            "Bird",
                            &[
                                "adult eagle",
                                "adult parrot",
                                "adult owl",
                                "adult blue jay",
                                "adult crow",
                            ],
                        ),
                    ],
                },
            ],
            Template::TeachersInSchool => [
                Layer {
                    category: "City",
                    sublists: &[
                        (
                            "Names without water",
                            &[
                                "Evervale City",
                                "Hawkesbury",
                                "Glenfield City",
                                "Westhaven City",
                                "Brightford",
                            ],
                        ),
                        (
                            "Names with water",
                            &[
                                "Riverton City",
                                "Clearwater Bay",
                                "Shoreline City",
                                "Oakbridge City",
                                "Ruby Bay",
                            ],
                        ),
                    ],
                },
                Layer {
                    category: "total number of schools",
                    sublists: &[(
                        "Common",
                        &[
                            "elementary school",
                            "private middle school",
                            "public highschool",
                            "regional medical school",
                            "culinarian school",
                        ],
                    )],
                },
            ],
            Template::MovieFestivalAwards => [
                Layer {
                    category: "Festivals",
                    sublists: &[
                        (
                            "Random",
                            &[
                                "Taylor Movie Festival",
                                "Verdi Movie Festival",
                                "West Sahara Movie Festival",
                                "Northwood Movie Festival",
                                "Golden Banana Movie Festival",
                            ],
                        ),
                        (
                            "French",
                            &[
                                "Festival Lumière de Valmont",
                                "Rêves de Belleville",
                                "Cinéma de Montreval",
                                "Festival de Clairmont",
                                "Festival de Saint-Rivage",
                            ],
                        ),
                    ],
                },
                Layer {
                    category: "total number of movies",
                    sublists: &[(
                        "Common",
                        &[
                            "upbeat metropolis comedy",
                            "solemn period drama",
                            "futuristic sci-fi movie",
                            "calm road movie",
                            "intense detective thriller",
                        ],
                    )],
                },
            ],
        }
    }
}
