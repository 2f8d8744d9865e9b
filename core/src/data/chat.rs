//! Supervised fine-tuning rows rendered in ChatML (Qwen2.5's chat template) or the model's own
//! chat template ([`ChatFormat`]), with completion-only targets.
//!
//! In ChatML a turn renders as `<|im_start|>{role}\n{content}<|im_end|>\n`; without a system turn, Qwen's
//! default system prompt is inserted, as the Qwen2.5 template does. Targets are the assistant
//! contents plus their `<|im_end|>` (not the newline after it); everything else (system, user,
//! the `<|im_start|>assistant\n` headers, and in prompt/completion rows every turn of the prompt,
//! as TRL's completion-only loss) is context only. Messages carrying tool calls, and in ChatML
//! roles other than system, user and assistant (tool turns) and a tokenizer without the ChatML
//! tokens, are errors: they would not render as the template renders them. With a model's
//! template, the targets of an assistant turn are the text the template adds for it (see
//! [`ChatFormat::Template`]). The whole text is tokenized at once and targets are chosen by
//! character offsets, so the ids equal `tokenizer(apply_chat_template(...))`.

use std::ops::Range;
#[cfg(feature = "tasks")]
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::sample::Sample;
#[cfg(feature = "tasks")]
use super::sft_source::{SftExample, SftSource, read_sft_rows};
use crate::error::{Error, Result};
#[cfg(feature = "tasks")]
use crate::model::hf::CompanionEdits;
use crate::tokenizer::Tokenizer;
#[cfg(feature = "code")]
use crate::tokenizer::chat_template::ChatTemplate;

/// Qwen2.5's default system prompt.
pub const QWEN_DEFAULT_SYSTEM: &str = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

/// Qwen2.5's chat template (its instruct models' `tokenizer_config.json` `chat_template`; TRL's
/// `chat_templates/qwen2_5.jinja`), which ChatML renders byte for byte: a model carrying it is
/// rendered by [`ChatFormat::ChatMl`].
pub const QWEN2_5_CHAT_TEMPLATE: &str = include_str!("qwen2_5_chat_template.jinja");

/// Why `system_prompt = ""` goes with ChatML only (the config check and [`ChatFormat::resolve`]).
pub const NO_SYSTEM_TURN_IS_CHATML: &str = "[data] system_prompt = \"\" (no system turn) renders in ChatML: a chat template decides the system turn itself; drop system_prompt, or set chat_template = \"chatml\"";

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// An SFT row: `{"messages": [...]}` or `{"prompt": ..., "completion": ...}` where prompt and
/// completion are strings (a user turn / an assistant turn) or lists of messages.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum SftRow {
    Messages { messages: Vec<Message> },
    PromptCompletion { prompt: Turns, completion: Turns },
}

/// A string (one turn of the implied role) or explicit messages.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Turns {
    Text(String),
    Messages(Vec<Message>),
}

impl SftRow {
    /// How many leading turns of [`SftRow::messages`] are the prompt (context only): a
    /// prompt/completion row's prompt; none of a `messages` row.
    pub fn prompt_turns(&self) -> usize {
        match self {
            SftRow::Messages { .. } => 0,
            SftRow::PromptCompletion { prompt: Turns::Text(_), .. } => 1,
            SftRow::PromptCompletion { prompt: Turns::Messages(m), .. } => m.len(),
        }
    }

    /// The conversation as messages.
    pub fn messages(&self) -> Vec<Message> {
        let turns = |t: &Turns, role: &str| match t {
            Turns::Text(content) => vec![Message { role: role.into(), content: content.clone() }],
            Turns::Messages(m) => m.clone(),
        };
        match self {
            SftRow::Messages { messages } => messages.clone(),
            SftRow::PromptCompletion { prompt, completion } => {
                [turns(prompt, "user"), turns(completion, "assistant")].concat()
            }
        }
    }
}

/// `[data] chat_template`: how SFT rows are rendered when the tokenizer's own template is not
/// wanted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum TemplateChoice {
    /// `"chatml"`: kiln's ChatML (Qwen2.5's template byte for byte, with `system_prompt`).
    ChatMl,
    /// A model directory (its `chat_template.jinja` or `tokenizer_config.json`'s template) or a
    /// Jinja file, as TRL's `chat_template_path`; relative to the config file.
    Path(std::path::PathBuf),
}

impl From<String> for TemplateChoice {
    fn from(s: String) -> Self {
        if s == "chatml" { TemplateChoice::ChatMl } else { TemplateChoice::Path(s.into()) }
    }
}

impl From<TemplateChoice> for String {
    fn from(c: TemplateChoice) -> Self {
        match c {
            TemplateChoice::ChatMl => "chatml".into(),
            TemplateChoice::Path(p) => p.display().to_string(),
        }
    }
}

/// The columns that make a conversation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftColumns {
    /// A list of `{role, content}` messages ...
    pub messages: Option<String>,
    /// ... or a prompt (user turn or messages) and a completion (assistant turn or messages).
    pub prompt: Option<String>,
    pub completion: Option<String>,
}

impl SftColumns {
    /// The column names to read; an error unless exactly one of the two shapes is given.
    pub fn names(&self) -> Result<Vec<&str>> {
        match (&self.messages, &self.prompt, &self.completion) {
            (Some(m), None, None) => Ok(vec![m]),
            (None, Some(p), Some(c)) => Ok(vec![p, c]),
            _ => Err(Error::InvalidInput(
                "SFT columns: give either `messages`, or `prompt` and `completion` (e.g. { messages = \"messages\" } or { prompt = \"prompt\", completion = \"generation\" })".into(),
            )),
        }
    }

    /// The conversation of one row, and how many of its leading turns are the prompt (context
    /// only; see [`SftRow::prompt_turns`]). A string prompt or completion is one user or
    /// assistant turn (TRL trains on string columns as plain text; kiln always renders a
    /// conversation).
    pub fn conversation(&self, row: &Map<String, Value>) -> std::result::Result<(Vec<Message>, usize), String> {
        let column = |name: &str| match row.get(name) {
            None => Err(format!("no column {name:?}")),
            Some(Value::Null) => Err(format!("column {name:?} is null")),
            Some(value) => Ok(value),
        };
        let turns = |name: &str, role: &str| -> std::result::Result<Vec<Message>, String> {
            match column(name)? {
                Value::String(content) => Ok(vec![Message { role: role.into(), content: content.clone() }]),
                value => messages_of(value).map_err(|e| format!("column {name:?}: {e}")),
            }
        };
        match (&self.messages, &self.prompt, &self.completion) {
            (Some(m), _, _) => Ok((messages_of(column(m)?).map_err(|e| format!("column {m:?}: {e}"))?, 0)),
            (None, Some(p), Some(c)) => {
                let prompt = turns(p, "user")?;
                let prompt_turns = prompt.len();
                Ok(([prompt, turns(c, "assistant")?].concat(), prompt_turns))
            }
            _ => Err("no columns chosen".into()),
        }
    }
}

fn messages_of(value: &Value) -> std::result::Result<Vec<Message>, String> {
    let list = value.as_array().ok_or("expected a string or a list of {role, content}")?;
    list.iter()
        .map(|m| {
            check_message_fields(m)?;
            match (m.get("role").and_then(Value::as_str), m.get("content").and_then(Value::as_str)) {
                (Some(role), Some(content)) => Ok(Message { role: role.into(), content: content.into() }),
                (Some(_), None) if m.get("content").is_some_and(Value::is_array) => {
                    Err(format!("`content` is a list of parts, not a string (join the text parts): {m}"))
                }
                _ => Err(format!("a message without string `role` and `content`: {m}")),
            }
        })
        .collect()
}

/// Message fields Qwen2.5's template renders and kiln would drop: refused rather than trained
/// without (null, `""` and `[]` are absent, as the template reads them; fields it ignores, such
/// as `reasoning_content`, are ignored here too).
const UNRENDERED_FIELDS: [&str; 2] = ["tool_calls", "function_call"];

fn check_message_fields(message: &Value) -> std::result::Result<(), String> {
    let given = |v: &Value| !(v.is_null() || v.as_str() == Some("") || v.as_array().is_some_and(Vec::is_empty));
    match UNRENDERED_FIELDS.iter().find(|k| message.get(**k).is_some_and(given)) {
        Some(key) => Err(format!("a message with `{key}`: kiln renders only `role` and `content` (no tool calls)")),
        None => Ok(()),
    }
}

/// The same check over a row's `messages`, `prompt` and `completion` lists (the rows read
/// without named columns).
pub fn check_row_messages(row: &Map<String, Value>) -> std::result::Result<(), String> {
    for key in ["messages", "prompt", "completion"] {
        if let Some(Value::Array(list)) = row.get(key) {
            list.iter().try_for_each(check_message_fields).map_err(|e| format!("`{key}`: {e}"))?;
        }
    }
    Ok(())
}

/// A rendered, tokenized row and what truncation removed.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedRow {
    pub sample: Sample,
    /// Tokens beyond `max_length` were dropped.
    pub truncated: bool,
    /// The last assistant turn's final fenced code block (```…```) did not survive truncation.
    pub final_code_lost: bool,
    /// The last target token (in ChatML the final `<|im_end|>`) did not survive truncation.
    pub final_answer_lost: bool,
}

/// How SFT rows become text: what `[data] chat_template` and `system_prompt` resolve to
/// ([`ChatFormat::resolve`]).
#[derive(Debug, Clone)]
pub enum ChatFormat {
    /// kiln's ChatML, Qwen2.5's template byte for byte; `default_system` is inserted when a row
    /// has no system turn (`None`: no system turn at all).
    ChatMl { default_system: Option<String> },
    /// A Hugging Face chat template, rendered as `apply_chat_template` renders it; `system` is
    /// inserted when a row has no system turn (`None`: the template decides, e.g. Qwen2.5's
    /// inserts its default). An assistant turn's targets are the text the template adds for it
    /// after its generation prompt (`add_generation_prompt`), as TRL's prompt/completion loss
    /// takes them, without trailing whitespace (the newline after `<|im_end|>`, as ChatML's).
    #[cfg(feature = "code")]
    Template { template: ChatTemplate, system: Option<String> },
}

impl ChatFormat {
    /// kiln's ChatML with Qwen2.5's default system prompt.
    pub fn qwen() -> Self {
        ChatFormat::ChatMl { default_system: Some(QWEN_DEFAULT_SYSTEM.into()) }
    }

    /// The format of `[data] chat_template = choice` and `system_prompt` for a run whose
    /// tokenizer is `tokenizer`: `"chatml"`; a model directory or Jinja file; or, when not given,
    /// the tokenizer's own template as TRL renders with, ChatML when it has none or with
    /// `system_prompt = ""` (no system turn, which only ChatML promises). A template that is
    /// Qwen2.5's ([`QWEN2_5_CHAT_TEMPLATE`]) is ChatML. `system_prompt` unset means Qwen's
    /// default in ChatML and the template's own default otherwise.
    #[cfg(feature = "tasks")]
    #[cfg_attr(not(feature = "code"), allow(unused_variables))]
    pub fn resolve(choice: Option<&TemplateChoice>, system_prompt: Option<&str>, tokenizer: &Tokenizer) -> Result<Self> {
        Self::resolve_reading(choice, system_prompt, tokenizer).map(|(format, _)| format)
    }

    /// An SFT run's format ([`ChatFormat::resolve`]) and the edits its checkpoints make
    /// ([`ChatFormat::checkpoint_edits`]), the template read once.
    #[cfg(feature = "tasks")]
    pub fn for_sft(choice: Option<&TemplateChoice>, system_prompt: Option<&str>, eos_token: Option<&str>, tokenizer: &Tokenizer) -> Result<(Self, CompanionEdits)> {
        let (format, dir_eos) = Self::resolve_reading(choice, system_prompt, tokenizer)?;
        let edits = format.checkpoint_edits(choice, dir_eos.as_deref(), eos_token, tokenizer)?;
        Ok((format, edits))
    }

    /// [`ChatFormat::resolve`], and the EOS of the model directory `choice` names (its
    /// `tokenizer_config.json`'s), read with its template.
    #[cfg(feature = "tasks")]
    #[cfg_attr(not(feature = "code"), allow(unused_variables))]
    fn resolve_reading(choice: Option<&TemplateChoice>, system_prompt: Option<&str>, tokenizer: &Tokenizer) -> Result<(Self, Option<String>)> {
        let chatml = || match system_prompt {
            None => Self::qwen(),
            Some("") => ChatFormat::ChatMl { default_system: None },
            Some(s) => ChatFormat::ChatMl { default_system: Some(s.into()) },
        };
        #[cfg(feature = "code")]
        {
            let (template, dir_eos) = match choice {
                Some(TemplateChoice::ChatMl) => return Ok((chatml(), None)),
                Some(TemplateChoice::Path(path)) => {
                    let tokenizer_dir = tokenizer.path().parent().unwrap_or(Path::new("."));
                    let template = ChatTemplate::from_path(path, tokenizer_dir)?;
                    // (a Jinja file sees the training tokenizer's special tokens: no EOS of its own)
                    let eos = path.is_dir().then(|| template.special_token("eos_token").map(String::from)).flatten();
                    (template, eos)
                }
                None if system_prompt == Some("") => return Ok((chatml(), None)),
                None => match tokenizer.chat_template()? {
                    Some(template) => (template, None),
                    None => return Ok((chatml(), None)),
                },
            };
            // (Qwen2.5's own template is ChatML: the same text and targets, without Jinja, and
            // recorded as "chatml", as runs from before the key rendered it.)
            if template.source() == QWEN2_5_CHAT_TEMPLATE {
                return Ok((chatml(), dir_eos));
            }
            if system_prompt == Some("") {
                return Err(Error::InvalidInput(format!("{} ({})", NO_SYSTEM_TURN_IS_CHATML, template.origin().display())));
            }
            Ok((ChatFormat::Template { template, system: system_prompt.map(String::from) }, dir_eos))
        }
        #[cfg(not(feature = "code"))]
        match choice {
            Some(TemplateChoice::Path(path)) => Err(Error::InvalidInput(format!(
                "[data] chat_template = {:?}: this kiln was built without chat templates (the `code` feature); use \"chatml\"",
                path.display().to_string()
            ))),
            _ => Ok((chatml(), None)),
        }
    }

    /// What an SFT run rendering its rows in this format changes in the tokenizer files its
    /// checkpoints copy, as TRL saves a run: the template the rows were rendered with, where it
    /// is not the tokenizer's own (`chat_template.jinja`; ChatML's is Qwen2.5's template; a
    /// `system_prompt` is not part of it, as TRL has none: pass it as a system message); with
    /// `[data] chat_template` naming a model directory whose EOS (`dir_eos`) differs from the
    /// tokenizer's, that EOS (TRL's `clone_chat_template`: a base model trained on an instruct
    /// template's turns then stops where they end); else `eos_token` (`[data] eos_token`, TRL's
    /// SFTConfig `eos_token`), keeping the generation config's other EOS ids after it, as TRL
    /// does. An EOS the tokenizer lacks is an error (TRL adds a template's and resizes the
    /// embeddings; kiln does not).
    #[cfg(feature = "tasks")]
    fn checkpoint_edits(&self, choice: Option<&TemplateChoice>, dir_eos: Option<&str>, eos_token: Option<&str>, tokenizer: &Tokenizer) -> Result<CompanionEdits> {
        let mut edits = CompanionEdits::default();
        let trained = match self {
            ChatFormat::ChatMl { .. } => QWEN2_5_CHAT_TEMPLATE,
            #[cfg(feature = "code")]
            ChatFormat::Template { template, .. } => template.source(),
        };
        #[cfg(feature = "code")]
        let own = tokenizer.chat_template()?.map(|t| t.source().to_owned());
        #[cfg(not(feature = "code"))]
        let own = choice.is_none().then(|| trained.to_owned());
        if own.as_deref() != Some(trained) {
            edits.chat_template = Some(trained.to_owned());
        }
        // An EOS the tokenizer lacks is refused, naming the file that named it.
        let id_of = |eos: &str, file: Option<PathBuf>, message: String| {
            tokenizer.token_id(eos).ok_or_else(|| match file {
                Some(file) => Error::config(file, message),
                None => Error::InvalidInput(message),
            })
        };
        let tokenizer_path = tokenizer.path().display();
        let differs = |eos: &&str| Some(*eos) != tokenizer.eos_token();
        if let Some(eos) = eos_token {
            let id = id_of(eos, None, format!("[data] eos_token {eos:?} is not in the tokenizer of {tokenizer_path} (as TRL refuses it)"))?;
            if differs(&eos) {
                (edits.eos, edits.keep_generation_eos) = (Some((eos.to_owned(), id)), true);
            }
        }
        // (the template directory's EOS, where it differs, is the one its turns end with)
        if let (Some(eos), Some(TemplateChoice::Path(dir))) = (dir_eos.filter(differs), choice) {
            let id = id_of(eos, Some(dir.join("tokenizer_config.json")), format!(
                "eos_token {eos:?} (the template's, which a run trained on it ends turns with) is not in the tokenizer of {tokenizer_path}; kiln does not add tokens (TRL's clone_chat_template resizes the embeddings)"
            ))?;
            (edits.eos, edits.keep_generation_eos) = (Some((eos.to_owned(), id)), false);
        }
        Ok(edits)
    }

    /// What the run's data report names: `chatml` or the template's file.
    pub fn name(&self) -> String {
        match self {
            ChatFormat::ChatMl { .. } => "chatml".into(),
            #[cfg(feature = "code")]
            ChatFormat::Template { template, .. } => template.origin().display().to_string(),
        }
    }
}

/// Renders `messages` in `format`, tokenizes the text at once and marks the assistant targets
/// by character offsets; keeps the first `max_length` tokens if given. The first `prompt_turns`
/// messages are context only (a prompt/completion row's prompt).
pub fn render(messages: &[Message], prompt_turns: usize, tokenizer: &Tokenizer, format: &ChatFormat, max_length: Option<usize>) -> Result<RenderedRow> {
    if !messages[prompt_turns.min(messages.len())..].iter().any(|m| m.role == "assistant") {
        return Err(Error::InvalidInput("an SFT row needs at least one assistant turn (after the prompt)".into()));
    }
    let (text, spans) = match format {
        ChatFormat::ChatMl { default_system } => chatml_text(messages, prompt_turns, tokenizer, default_system.as_deref())?,
        #[cfg(feature = "code")]
        ChatFormat::Template { template, system } => template_text(messages, prompt_turns, template, system.as_deref())?,
    };
    let final_code_end = spans.last().and_then(|span| text[span.clone()].rfind("```").map(|i| span.start + i + 3));
    let (ids, offsets) = tokenizer.encode_with_offsets(&text)?;
    let targets: Vec<bool> = offsets.iter().map(|&(s, _)| spans.iter().any(|span| span.contains(&s))).collect();
    let last_target = targets.iter().rposition(|&t| t);
    let keep = max_length.unwrap_or(ids.len()).min(ids.len());
    let kept_bytes = if keep == 0 { 0 } else { offsets[keep - 1].1 };
    let row = RenderedRow {
        truncated: keep < ids.len(),
        final_code_lost: final_code_end.is_some_and(|end| end > kept_bytes),
        final_answer_lost: last_target.is_some_and(|i| i >= keep),
        sample: Sample { ids: ids[..keep].to_vec(), targets: targets[..keep].to_vec() },
    };
    Ok(row)
}

/// The text and target spans of ChatML: a turn is `<|im_start|>{role}\n{content}<|im_end|>\n`;
/// targets are the content and `<|im_end|>` of the assistant turns after the prompt.
fn chatml_text(messages: &[Message], prompt_turns: usize, tokenizer: &Tokenizer, default_system: Option<&str>) -> Result<(String, Vec<Range<usize>>)> {
    if let Some(m) = messages.iter().find(|m| !["system", "user", "assistant"].contains(&m.role.as_str())) {
        return Err(Error::InvalidInput(format!("role {:?} is not supported (system, user, assistant)", m.role)));
    }
    for tag in ["<|im_start|>", "<|im_end|>"] {
        if tokenizer.token_id(tag).is_none() {
            return Err(Error::InvalidInput(format!(
                "the tokenizer has no {tag} token: SFT rows are rendered in ChatML (Qwen2.5's chat template); use a tokenizer with ChatML's tokens (a Qwen2/2.5 one) or name its chat template ([data] chat_template)"
            )));
        }
    }
    let mut text = String::new();
    let mut spans = Vec::new();
    let system = with_system(messages, prompt_turns, default_system);
    for (i, message) in system.messages.iter().enumerate() {
        text.push_str("<|im_start|>");
        text.push_str(&message.role);
        text.push('\n');
        let start = text.len();
        text.push_str(&message.content);
        text.push_str("<|im_end|>");
        if message.role == "assistant" && i >= system.prompt_turns {
            spans.push(start..text.len());
        }
        text.push('\n');
    }
    Ok((text, spans))
}

/// The text of a chat template and its target spans. For each assistant turn after the prompt,
/// as TRL's `apply_chat_template` splits a prompt/completion row: the conversation before it
/// rendered with the generation prompt, and up to it without; the turn's targets start where
/// the two first differ (their common prefix is the prompt) and end where the second ends,
/// trailing whitespace left out. A template that renders earlier turns differently as the
/// conversation grows, or that drops part of an assistant turn's content (DeepSeek-R1-Distill's
/// keeps only the text after `</think>`; TRL trains on what is left), is an error naming the
/// turn.
#[cfg(feature = "code")]
fn template_text(messages: &[Message], prompt_turns: usize, template: &ChatTemplate, system: Option<&str>) -> Result<(String, Vec<Range<usize>>)> {
    let conversation = with_system(messages, prompt_turns, system);
    let messages = &conversation.messages;
    let text = template.render(messages, false)?;
    let turn = |i: usize| i + 1 + conversation.given - messages.len();
    let mut spans = Vec::new();
    for (i, message) in messages.iter().enumerate().skip(conversation.prompt_turns) {
        if message.role != "assistant" {
            continue;
        }
        if i == 0 {
            return Err(Error::InvalidInput(format!(
                "the row starts with an assistant turn: the chat template {} renders a prompt before an assistant turn (a system or user turn first, or system_prompt)",
                template.origin().display()
            )));
        }
        let before = template.render(&messages[..i], false)?;
        let prompt = template.render(&messages[..i], true)?;
        let through = template.render(&messages[..=i], false)?;
        let refuse = |what: &str| {
            Error::InvalidInput(format!(
                "the chat template {} {what} (message {} of the row, an assistant turn); kiln cannot tell what to train on: use a template that renders it as given (for DeepSeek-R1-Distill, TRL's deepseek_r1_distill_training.jinja), or chat_template = \"chatml\"",
                template.origin().display(),
                turn(i)
            ))
        };
        if !text.starts_with(&through) || !through.starts_with(&before) {
            return Err(refuse("renders the turns before this one differently once it follows"));
        }
        if !through[before.len()..].contains(message.content.trim()) {
            return Err(refuse("drops or rewrites part of the turn's content"));
        }
        let start = common_prefix(&prompt, &through);
        let end = start + through[start..].trim_end().len();
        spans.push(start..end);
    }
    Ok((text, spans))
}

/// The length in bytes of the longest common prefix of `a` and `b`, at a character boundary.
#[cfg(feature = "code")]
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices().zip(b.chars()).find(|((_, x), y)| x != y).map_or(a.len().min(b.len()), |((i, _), _)| i)
}

/// A conversation with `system` inserted first when it has no system turn.
struct WithSystem {
    messages: Vec<Message>,
    /// Leading context-only turns (the inserted system turn counts).
    prompt_turns: usize,
    /// How many messages the row itself has.
    #[cfg_attr(not(feature = "code"), allow(dead_code))]
    given: usize,
}

fn with_system(messages: &[Message], prompt_turns: usize, system: Option<&str>) -> WithSystem {
    let insert = (messages.first().map(|m| m.role.as_str()) != Some("system")).then_some(system).flatten();
    let inserted = insert.map(|content| Message { role: "system".into(), content: content.into() });
    let count = inserted.is_some() as usize;
    WithSystem { messages: inserted.into_iter().chain(messages.iter().cloned()).collect(), prompt_turns: prompt_turns + count, given: messages.len() }
}

/// Counts over the rendered SFT rows (spec code-sft.md §3.4: record `max_length`, how many rows
/// exceed it and whether their final code block survives).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SftReport {
    pub rows: usize,
    /// How the rows were rendered: `chatml`, or the chat template's file.
    pub chat_template: String,
    /// The length rows are cut to (keeping the start), if any.
    pub max_length: Option<usize>,
    /// Rows longer than `max_length` (cut at the end, keeping the start).
    pub truncated: usize,
    /// Rows whose final fenced code block was cut.
    pub final_code_lost: usize,
    /// Rows whose last assistant turn has no fenced code block at all (e.g. generations that
    /// hit the reference model's length limit).
    pub no_code_block: usize,
    /// Rows whose last target token (the final answer's `<|im_end|>`) was cut.
    pub final_answer_lost: usize,
    /// Target tokens in all rows.
    pub targets: usize,
    /// Rows left without a target token (`max_length` cut within the prompt): they train nothing.
    pub no_targets: usize,
}

/// Renders every example (see [`render`]); a row that cannot be rendered is an error naming its
/// file and line or row.
#[cfg(feature = "tasks")]
pub fn render_examples(examples: &[SftExample], tokenizer: &Tokenizer, format: &ChatFormat, max_length: Option<usize>) -> Result<(Vec<Sample>, SftReport)> {
    let mut samples = Vec::with_capacity(examples.len());
    let mut report = SftReport { max_length, chat_template: format.name(), ..Default::default() };
    let stage = crate::progress::stage("rendering chat rows", examples.len() as u64, "rows");
    for (i, example) in examples.iter().enumerate() {
        let rendered = render(&example.messages, example.prompt_turns, tokenizer, format, max_length).map_err(|e| example.error(e.to_string()))?;
        let last_assistant = example.messages.iter().rev().find(|m| m.role == "assistant");
        report.rows += 1;
        report.truncated += rendered.truncated as usize;
        report.final_code_lost += rendered.final_code_lost as usize;
        report.no_code_block += last_assistant.is_some_and(|m| !m.content.contains("```")) as usize;
        report.final_answer_lost += rendered.final_answer_lost as usize;
        report.targets += rendered.sample.num_targets();
        report.no_targets += (rendered.sample.num_targets() == 0) as usize;
        samples.push(rendered.sample);
        stage.set_position(i as u64 + 1);
    }
    Ok((samples, report))
}

/// Reads an SFT JSONL file (one [`SftRow`] per line) and renders every row; a bad line is an
/// error naming file and line. [`super::sft_source`] reads Parquet, chosen columns and splits.
#[cfg(feature = "tasks")]
pub fn sft_samples(path: &Path, tokenizer: &Tokenizer, format: &ChatFormat, max_length: Option<usize>) -> Result<(Vec<Sample>, SftReport)> {
    let rows = read_sft_rows(&SftSource { path: path.to_path_buf(), columns: None, split: None })?;
    render_examples(&rows.train, tokenizer, format, max_length)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &ChatFormat = &ChatFormat::ChatMl { default_system: None };

    fn chatml_tokenizer() -> Tokenizer {
        let corpus = (0..200).map(|i| format!("def f{i}(x):\n    return x * {i}\nuser asks; assistant answers {i}"));
        Tokenizer::train_byte_level_bpe(corpus, 400, &["<|endoftext|>", "<|im_start|>", "<|im_end|>"]).unwrap()
    }

    fn target_text(t: &Tokenizer, row: &RenderedRow) -> String {
        let ids: Vec<u32> = row.sample.ids.iter().zip(&row.sample.targets).filter(|(_, m)| **m).map(|(i, _)| *i).collect();
        t.decode(&ids, false).unwrap()
    }

    #[test]
    fn targets_are_assistant_content_and_im_end() {
        let t = chatml_tokenizer();
        let messages = vec![
            Message { role: "user".into(), content: "Write f.".into() },
            Message { role: "assistant".into(), content: "```python\ndef f(x):\n    return x\n```".into() },
        ];
        let row = render(&messages, 0, &t, &ChatFormat::qwen(), None).unwrap();
        let text = t.decode(&row.sample.ids, false).unwrap();
        assert!(text.starts_with(&format!("<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nWrite f.<|im_end|>\n<|im_start|>assistant\n")));
        assert_eq!(target_text(&t, &row), "```python\ndef f(x):\n    return x\n```<|im_end|>");
        assert!(!row.truncated && !row.final_code_lost && !row.final_answer_lost);
        assert_eq!(row.sample.ids, t.encode(&text).unwrap(), "one tokenization of the whole text");

        // Cut inside the code block: the final code and the final answer are lost.
        let cut = row.sample.ids.len() - 4;
        let short = render(&messages, 0, &t, &ChatFormat::qwen(), Some(cut)).unwrap();
        assert_eq!(short.sample.ids.len(), cut);
        assert!(short.truncated && short.final_code_lost && short.final_answer_lost);
    }

    #[test]
    fn an_explicit_system_turn_replaces_the_default_and_every_assistant_turn_is_a_target() {
        let t = chatml_tokenizer();
        let m = |role: &str, content: &str| Message { role: role.into(), content: content.into() };
        let messages = vec![m("system", "Be terse."), m("user", "a"), m("assistant", "b"), m("user", "c"), m("assistant", "d")];
        let row = render(&messages, 0, &t, &ChatFormat::qwen(), None).unwrap();
        assert!(t.decode(&row.sample.ids, false).unwrap().starts_with("<|im_start|>system\nBe terse.<|im_end|>"));
        assert_eq!(target_text(&t, &row), "b<|im_end|>d<|im_end|>");
        assert!(render(&messages[..2], 0, &t, PLAIN, None).is_err(), "no assistant turn");
    }

    /// TRL's completion-only loss: a prompt/completion row trains on its completion alone, even
    /// where the prompt holds assistant turns; tool turns and fields, content parts and a
    /// tokenizer without ChatML's tokens are errors, not rendered otherwise than the template.
    #[test]
    fn prompt_turns_are_context_and_unrendered_input_is_refused() {
        let t = chatml_tokenizer();
        let row: SftRow = serde_json::from_str(
            r#"{"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "WRONG"}, {"role": "user", "content": "c"}],
                "completion": [{"role": "assistant", "content": "d"}]}"#,
        )
        .unwrap();
        assert_eq!(row.prompt_turns(), 3);
        let rendered = render(&row.messages(), row.prompt_turns(), &t, PLAIN, None).unwrap();
        assert_eq!(target_text(&t, &rendered), "d<|im_end|>");
        assert!(t.decode(&rendered.sample.ids, false).unwrap().contains("WRONG"), "the prompt's turn is context");
        let columns = SftColumns { prompt: Some("p".into()), completion: Some("c".into()), ..Default::default() };
        let fields: Map<String, Value> = serde_json::from_str(r#"{"p": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "WRONG"}], "c": "d"}"#).unwrap();
        assert_eq!(columns.conversation(&fields).unwrap().1, 2);

        let m = |role: &str, content: &str| Message { role: role.into(), content: content.into() };
        let err = render(&[m("user", "a"), m("tool", "5"), m("assistant", "b")], 0, &t, PLAIN, None).unwrap_err().to_string();
        assert!(err.contains("role \"tool\" is not supported"), "{err}");
        let plain = Tokenizer::train_byte_level_bpe((0..50).map(|i| format!("word {i}")), 300, &["<|endoftext|>"]).unwrap();
        let err = render(&[m("user", "a"), m("assistant", "b")], 0, &plain, PLAIN, None).unwrap_err().to_string();
        assert!(err.contains("the tokenizer has no <|im_start|> token"), "{err}");
        let row: Map<String, Value> =
            serde_json::from_str(r#"{"messages": [{"role": "user", "content": "add"}, {"role": "assistant", "content": "", "tool_calls": [{"name": "add"}]}]}"#).unwrap();
        assert!(check_row_messages(&row).is_err_and(|e| e.contains("`messages`: a message with `tool_calls`")));
        // Empty tool calls and fields the template ignores render as before.
        let row: Map<String, Value> =
            serde_json::from_str(r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": [], "reasoning_content": "c"}]}"#).unwrap();
        assert!(check_row_messages(&row).is_ok());
        let parts = serde_json::json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]);
        assert!(messages_of(&parts).is_err_and(|e| e.contains("a list of parts")));
    }

    #[test]
    fn rows_parse_both_shapes() {
        let a: SftRow = serde_json::from_str(r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}"#).unwrap();
        let b: SftRow = serde_json::from_str(r#"{"prompt": "hi", "completion": "yo"}"#).unwrap();
        assert_eq!(a.messages(), b.messages());
    }

    #[cfg(feature = "code")]
    #[test]
    fn the_chatml_text_is_qwen2_5_s_chat_template_and_codeforces_rows_report_their_code() {
        use crate::data::sft_source::{SftColumns, SftSource, read_sft_rows};
        use crate::tokenizer::chat_template::ChatTemplate;
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code");
        let qwen = ChatTemplate::from_model_dir(&fixtures.join("qwen2_5")).unwrap().unwrap();
        assert_eq!(qwen.source(), QWEN2_5_CHAT_TEMPLATE, "the template ChatML stands in for is the one transformers renders in chat_template_cases");
        let columns = SftColumns { messages: Some("messages".into()), ..Default::default() };
        let rows = read_sft_rows(&SftSource { path: fixtures.join("cots_mini"), columns: Some(columns), split: None }).unwrap();
        let t = chatml_tokenizer();
        for example in &rows.train {
            let row = render(&example.messages, example.prompt_turns, &t, &ChatFormat::qwen(), None).unwrap();
            assert_eq!(t.decode(&row.sample.ids, false).unwrap(), qwen.render(&example.messages, false).unwrap());
        }
        // The model's own template renders the same samples: text, ids and targets.
        let template = ChatFormat::Template { template: qwen.clone(), system: None };
        for example in &rows.train {
            let chatml = render(&example.messages, example.prompt_turns, &t, &ChatFormat::qwen(), None).unwrap();
            assert_eq!(render(&example.messages, example.prompt_turns, &t, &template, None).unwrap(), chatml);
        }
        let m = |role: &str, content: &str| Message { role: role.into(), content: content.into() };
        let turns = [m("user", "a"), m("assistant", "b\n"), m("user", "c"), m("assistant", "```python\nprint(1)\n```")];
        for (system, prompt_turns) in [(None, 0), (Some("Be terse."), 0), (Some("Be terse."), 2)] {
            let chatml = ChatFormat::ChatMl { default_system: Some(system.unwrap_or(QWEN_DEFAULT_SYSTEM).into()) };
            let template = ChatFormat::Template { template: qwen.clone(), system: system.map(String::from) };
            assert_eq!(render(&turns, prompt_turns, &t, &template, Some(30)).unwrap(), render(&turns, prompt_turns, &t, &chatml, Some(30)).unwrap());
        }
        let (samples, report) = render_examples(&rows.train, &t, &ChatFormat::qwen(), Some(400)).unwrap();
        assert_eq!((samples.len(), report.rows, report.max_length), (5, 5, Some(400)));
        // Row 4 of the fixture stopped at the length limit: its generation has no code block.
        assert_eq!(report.no_code_block, 1);
        assert_eq!(report.truncated, 5, "every row is longer than 400 tokens");
        assert_eq!(report.final_code_lost, 4, "the four code blocks sit at the end and are cut");
    }

    /// TRL 1.16's split of prompt/completion rows (`make_sft_template_cases.py`): an assistant
    /// turn's targets start where its prompt (rendered with the generation prompt) and the
    /// conversation through it part, and run to the end of its text; a template that drops part
    /// of the turn (DeepSeek-R1-Distill's, up to `</think>`, which TRL trains without) is refused.
    #[cfg(feature = "code")]
    #[test]
    fn chat_templates_split_turns_as_trl_does() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code");
        let dir = tempfile::tempdir().unwrap();
        let (mut checked, mut refused) = (0, 0);
        for line in std::fs::read_to_string(fixtures.join("sft_template_cases.jsonl")).unwrap().lines() {
            let case: Value = serde_json::from_str(line).unwrap();
            let name = case["template"].as_str().unwrap();
            let source = match name {
                "qwen2_5" => fixtures.join("qwen2_5_chat_template.jinja"),
                _ => fixtures.join("sft_templates").join(format!("{name}.jinja")),
            };
            let tokens = serde_json::json!({ "bos_token": case["bos_token"], "eos_token": case["eos_token"] });
            std::fs::write(dir.path().join("tokenizer_config.json"), tokens.to_string()).unwrap();
            let template = ChatTemplate::from_path(&source, dir.path()).unwrap();
            let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
            let prompt_turns = case["prompt_turns"].as_u64().unwrap() as usize;
            let result = template_text(&messages, prompt_turns, &template, None);
            let reasoning = messages[prompt_turns..].iter().any(|m| m.role == "assistant" && m.content.contains("</think>"));
            if name == "deepseek_r1_distill" && reasoning {
                let err = result.unwrap_err().to_string();
                assert!(err.contains("drops or rewrites part of the turn's content") && err.contains("deepseek_r1_distill.jinja"), "{err}");
                refused += 1;
                continue;
            }
            let (text, spans) = result.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(text, case["text"].as_str().unwrap(), "{name}");
            let turns = case["turns"].as_array().unwrap();
            assert_eq!(spans.len(), turns.len());
            for (span, turn) in spans.iter().zip(turns) {
                assert_eq!(span.start, turn["prompt"].as_str().unwrap().len(), "{name}: {turn}");
                assert_eq!(&text[span.clone()], turn["completion"].as_str().unwrap().trim_end(), "{name}: {turn}");
            }
            checked += 1;
        }
        assert_eq!((checked, refused), (12, 3));

        // A template that renders earlier turns otherwise once more follow, a row that starts
        // with an assistant turn, and a template file that is not Jinja: refused.
        let m = |role: &str, content: &str| Message { role: role.into(), content: content.into() };
        let last_only = ChatTemplate::new("{% for m in messages %}{% if loop.last %}{{ m.content }}{% else %}.{% endif %}{% endfor %}", "last.jinja").unwrap();
        let err = template_text(&[m("user", "a"), m("assistant", "b"), m("user", "c"), m("assistant", "d")], 0, &last_only, None).unwrap_err().to_string();
        assert!(err.contains("renders the turns before this one differently") && err.contains("message 2 of the row"), "{err}");
        let plain = ChatTemplate::new("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", "plain.jinja").unwrap();
        let err = template_text(&[m("assistant", "b")], 0, &plain, None).unwrap_err().to_string();
        assert!(err.contains("the row starts with an assistant turn"), "{err}");
        assert!(template_text(&[m("assistant", "b")], 0, &plain, Some("sys")).is_ok(), "a system prompt comes first");
        let err = ChatTemplate::from_path(&fixtures.join("qwen2_5/tokenizer_config.json"), dir.path()).unwrap_err().to_string();
        assert!(err.contains("a model directory or a .jinja file"), "{err}");
    }

    /// What an SFT run changes in its checkpoints' tokenizer files: the template its rows were
    /// rendered with where it is not the tokenizer's own; a model directory's EOS where it
    /// differs (TRL's clone_chat_template), refused when the tokenizer lacks it; `[data]
    /// eos_token`; and the edits applied.
    #[test]
    fn checkpoints_carry_the_template_they_trained_with_and_its_eos() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code");
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        std::fs::create_dir_all(&base).unwrap();
        chatml_tokenizer().with_special_tokens("<|endoftext|>", "<|endoftext|>").unwrap().save(&base).unwrap();
        // The same tokenizer with a template of its own (R1-Distill's training variant).
        let r1 = dir.path().join("r1");
        std::fs::create_dir_all(&r1).unwrap();
        let r1_source = std::fs::read_to_string(fixtures.join("sft_templates/deepseek_r1_distill_training.jinja")).unwrap();
        for name in ["tokenizer.json", "special_tokens_map.json"] {
            std::fs::copy(base.join(name), r1.join(name)).unwrap();
        }
        std::fs::write(r1.join("chat_template.jinja"), &r1_source).unwrap();
        let (tokenizer, r1_tokenizer) = (Tokenizer::from_file(&base).unwrap(), Tokenizer::from_file(&r1).unwrap());
        let im_end = tokenizer.token_id("<|im_end|>").unwrap();
        let instruct = fixtures.join("qwen2_5");
        let edits_for = |tokenizer: &Tokenizer, choice: Option<TemplateChoice>, system: Option<&str>, eos: Option<&str>| {
            ChatFormat::for_sft(choice.as_ref(), system, eos, tokenizer).map(|(_, edits)| edits)
        };
        let edits = |choice: Option<TemplateChoice>, system: Option<&str>| edits_for(&tokenizer, choice, system, None);

        // A tokenizer without a template trains in ChatML: Qwen2.5's template is saved, whatever
        // the system prompt (not part of a template).
        for (choice, system) in [(None, None), (Some(TemplateChoice::ChatMl), None), (Some(TemplateChoice::ChatMl), Some("Be brief.")), (Some(TemplateChoice::Path(instruct.clone())), Some(""))] {
            let e = edits(choice.clone(), system).unwrap();
            assert_eq!(e.chat_template.as_deref(), Some(QWEN2_5_CHAT_TEMPLATE), "{choice:?} {system:?}");
        }
        // The tokenizer's own template: nothing to save; another: saved as written, no EOS from a file.
        assert!(edits_for(&r1_tokenizer, None, None, None).unwrap().is_empty());
        assert_eq!(edits_for(&r1_tokenizer, Some(TemplateChoice::ChatMl), None, None).unwrap().chat_template.as_deref(), Some(QWEN2_5_CHAT_TEMPLATE));
        let jinja = fixtures.join("sft_templates/deepseek_r1_distill_training.jinja");
        let file = edits(Some(TemplateChoice::Path(jinja.clone())), None).unwrap();
        assert_eq!((file.chat_template, file.eos), (Some(r1_source.clone()), None), "a file: the template as written, no EOS");
        // A model directory: its template and its EOS (clone_chat_template).
        let cloned = edits(Some(TemplateChoice::Path(instruct.clone())), None).unwrap();
        assert_eq!(cloned.chat_template.as_deref(), Some(QWEN2_5_CHAT_TEMPLATE));
        assert_eq!((cloned.eos.clone(), cloned.keep_generation_eos), (Some(("<|im_end|>".to_owned(), im_end)), false));

        // Applied to a saved directory: the template file, the EOS everywhere it is named, other
        // fields kept (an integer past 2^64, as transformers writes model_max_length, included).
        let saved = dir.path().join("saved");
        std::fs::create_dir_all(&saved).unwrap();
        for name in ["tokenizer.json", "special_tokens_map.json"] {
            std::fs::copy(base.join(name), saved.join(name)).unwrap();
        }
        std::fs::write(
            saved.join("tokenizer_config.json"),
            r#"{"chat_template": "old", "eos_token": {"content": "<|endoftext|>", "special": true}, "model_max_length": 1000000000000000019884624838656}"#,
        )
        .unwrap();
        std::fs::write(saved.join("config.json"), r#"{"vocab_size": 400, "eos_token_id": 0}"#).unwrap();
        cloned.check(&saved).unwrap();
        cloned.apply(&saved).unwrap();
        assert_eq!(ChatTemplate::from_model_dir(&saved).unwrap().unwrap().source(), QWEN2_5_CHAT_TEMPLATE);
        let config: Value = serde_json::from_str(&std::fs::read_to_string(saved.join("tokenizer_config.json")).unwrap()).unwrap();
        assert_eq!(config["eos_token"], serde_json::json!({"content": "<|im_end|>", "special": true}));
        assert!(config.get("chat_template").is_none() && config["model_max_length"].as_f64() == Some(1e30), "{config}");
        assert_eq!(Tokenizer::from_file(&saved).unwrap().eos_token(), Some("<|im_end|>"));
        let model: Value = serde_json::from_str(&std::fs::read_to_string(saved.join("config.json")).unwrap()).unwrap();
        assert_eq!(model, serde_json::json!({"vocab_size": 400, "eos_token_id": im_end}));
        assert!(!saved.join("generation_config.json").exists(), "only files the model has are changed");

        // `[data] eos_token` (TRL's eos_token): the generation config's other EOS ids kept after
        // it; the template's model directory wins over it, as clone_chat_template runs after.
        let eos_only = edits_for(&tokenizer, None, None, Some("<|im_end|>")).unwrap();
        assert_eq!((eos_only.eos.clone(), eos_only.keep_generation_eos), (Some(("<|im_end|>".to_owned(), im_end)), true));
        assert!(edits_for(&tokenizer, None, None, Some("<|endoftext|>")).unwrap().eos.is_none(), "the tokenizer's own EOS");
        let both = edits_for(&tokenizer, Some(TemplateChoice::Path(instruct.clone())), None, Some("<|im_start|>")).unwrap();
        assert_eq!((both.eos, both.keep_generation_eos), (Some(("<|im_end|>".to_owned(), im_end)), false));
        let err = edits_for(&tokenizer, None, None, Some("<|nope|>")).unwrap_err().to_string();
        assert!(err.contains("[data] eos_token \"<|nope|>\" is not in the tokenizer"), "{err}");
        std::fs::write(saved.join("generation_config.json"), r#"{"eos_token_id": 0, "do_sample": true}"#).unwrap();
        eos_only.apply(&saved).unwrap();
        let generation: Value = serde_json::from_str(&std::fs::read_to_string(saved.join("generation_config.json")).unwrap()).unwrap();
        assert_eq!(generation, serde_json::json!({"eos_token_id": [im_end, 0], "do_sample": true}));
        cloned.apply(&saved).unwrap();
        let generation: Value = serde_json::from_str(&std::fs::read_to_string(saved.join("generation_config.json")).unwrap()).unwrap();
        assert_eq!(generation["eos_token_id"], serde_json::json!(im_end), "clone_chat_template sets the one id");

        // An EOS the tokenizer lacks (TRL would add it and resize the embeddings).
        let foreign = dir.path().join("foreign");
        std::fs::create_dir_all(&foreign).unwrap();
        std::fs::write(foreign.join("tokenizer_config.json"), r#"{"chat_template": "{{ messages[0].content }}", "eos_token": "<|eot_id|>"}"#).unwrap();
        let err = edits(Some(TemplateChoice::Path(foreign)), None).unwrap_err().to_string();
        assert!(err.contains("foreign/tokenizer_config.json") && err.contains("\"<|eot_id|>\"") && err.contains("not in the tokenizer"), "{err}");
        // A file the edits cannot read is found by the check, before a run trains.
        std::fs::write(saved.join("special_tokens_map.json"), "{not json").unwrap();
        assert!(cloned.check(&saved).unwrap_err().to_string().contains("special_tokens_map.json"));
    }
}
