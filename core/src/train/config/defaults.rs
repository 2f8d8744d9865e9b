//! What a run config leaves out, in one place per run family: a TOML table laid under the file
//! before it is read, so every section is read complete into the structs the run uses (no
//! `unwrap_or` at the point of use). `kiln config show` prints the result.

use std::borrow::Cow;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::Family;

/// `kiln pretrain` and `kiln sft`: Hugging Face Trainer's defaults. `[optimizer] lr` and
/// `[train] micro_batch` have none: a config must give them.
pub const NEXT_TOKEN: &str = r#"
[train]
grad_accum = 1
seed = 42
precision = "f32"
recompute = false
padding_free = false
shard_optimizer = false
grad_reduce_dtype = "f32"
overlap_grad_reduce = true

[optimizer]
weight_decay = 0.0
max_grad_norm = 1.0
beta1 = 0.9
beta2 = 0.999
eps = 1e-8

[schedule]
kind = "linear"
warmup_ratio = 0.0

[eval]
rows_per_op = 20
max_new_tokens = 320
"#;

/// `kiln rl` and `kiln opd`: the seed's verl settings (`docs/interplay.md` §6.1): n = 6 at
/// temperature 1, 1024 prompts per step in mini-batches of 256 (4 optimizer updates) and
/// micro-batches of 16, AdamW at a constant 1e-6 with weight decay 0.01 and clipping at 1.0, clip
/// ratio 0.2 with dual clip 3.0, token-mean aggregation, k3 KL to the initial policy with β =
/// 0.001, a checkpoint and (with an `[eval]`) a validation every 20 steps.
pub const POLICY_GRADIENT: &str = r#"
[train]
prompts_per_step = 1024
mini_batch = 256
micro_batch = 16
precision = "f32"
recompute = false
shard_optimizer = false
grad_reduce_dtype = "f32"
overlap_grad_reduce = true

[rollout]
n = 6
temperature = 1.0
top_p = 1.0
top_k = 0
min_p = 0.0
max_response_length = 1024
batch_size = 64
max_prefill_tokens = 8192

[optimizer]
lr = 1e-6
weight_decay = 0.01
max_grad_norm = 1.0
beta1 = 0.9
beta2 = 0.999
eps = 1e-8

[schedule]
kind = "constant"
warmup_ratio = 0.0

[loss]
clip_ratio = 0.2
clip_ratio_c = 3.0
agg = "token-mean"
adv_estimator = "grpo"
policy_loss = "vanilla"
kl_coef = 0.001
kl_estimator = "k3"
reward_scaling = "group"
epsilon = 1e-6

[output]
save_steps = 20

[eval]
every = 20

[teacher]
coef = 1.0
full_vocab = false
"#;

/// Sections a policy-gradient run has only when the file gives them (validation, GRPO's reward,
/// OPD's teacher): their defaults apply inside them.
const OPTIONAL_SECTIONS: [&str; 3] = ["eval", "reward", "teacher"];

/// Other names a file may give a key with a default by (serde's aliases): (section, key, alias).
const ALIASES: [(&str, &str, &str); 3] = [("output", "save_steps", "save_freq"), ("loss", "agg", "loss_agg_mode"), ("eval", "rows_per_op", "accuracy_rows")];

/// The defaults of `family`.
pub fn text(family: Family) -> &'static str {
    match family {
        Family::NextToken => NEXT_TOKEN,
        Family::PolicyGradient => POLICY_GRADIENT,
    }
}

/// Lays `family`'s defaults under `doc`: every key the file leaves out, in sections it has or
/// that every run has ([`OPTIONAL_SECTIONS`] only where the file has them). Keys added have an
/// empty span (they are in no line of the file).
pub(crate) fn lay_under(doc: &mut DeTable<'_>, family: Family) {
    let defaults = DeTable::parse(text(family)).expect("the defaults are TOML");
    for (key, value) in defaults.into_inner() {
        let name = key.get_ref().to_string();
        match doc.get_mut(name.as_str()).map(Spanned::get_mut) {
            Some(DeValue::Table(section)) => {
                if let DeValue::Table(defaults) = value.into_inner() {
                    for (key, value) in defaults {
                        let key = key.get_ref().as_ref();
                        let aliased = ALIASES.iter().any(|&(s, k, alias)| s == name && k == key && section.contains_key(alias));
                        if !section.contains_key(key) && !aliased {
                            section.insert(unspanned_key(key), unspanned(value.into_inner()));
                        }
                    }
                }
            }
            Some(_) => {} // not a table: the read reports it
            None if family == Family::PolicyGradient && OPTIONAL_SECTIONS.contains(&name.as_str()) => {}
            None => {
                doc.insert(unspanned_key(key.get_ref()), unspanned(value.into_inner()));
            }
        }
    }
}

fn unspanned_key(name: &str) -> Spanned<Cow<'static, str>> {
    Spanned::new(0..0, Cow::Owned(name.to_owned()))
}

/// `value` with its span, and those of everything in it, emptied.
fn unspanned<'i>(value: DeValue<'i>) -> Spanned<DeValue<'i>> {
    let value = match value {
        DeValue::Table(table) => DeValue::Table(table.into_iter().map(|(k, v)| (unspanned_key(k.get_ref()), unspanned(v.into_inner()))).collect()),
        DeValue::Array(items) => DeValue::Array(items.into_iter().map(|v| unspanned(v.into_inner())).collect()),
        other => other,
    };
    Spanned::new(0..0, value)
}
