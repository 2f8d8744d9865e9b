//! The probe on this machine: prints the layers and checks that every layer the kernel and the
//! privileges allow is active.

mod common;

#[test]
fn probe_reports_layers() {
    let sandbox = common::sandbox();
    let p = sandbox.protections();
    println!("{p}");
    assert!(p.confined(), "neither Landlock nor seccomp is active:\n{p}");
    for (name, layer) in p.layers() {
        if common::expect_layer(name) {
            assert!(
                layer.active,
                "layer {name} is off on this machine: {}\n{p}",
                layer.detail
            );
        }
    }
    let json = serde_json::to_value(p).unwrap();
    assert_eq!(
        json["seccomp"]["active"],
        serde_json::json!(p.seccomp.active)
    );
}
