//! Chat templates: the model's `tokenizer.chat_template` (Jinja, rendered with minijinja), or
//! ChatML when the model has none.

use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::error::{LlmError, Result};
use crate::model::Model;

/// One message of a conversation.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// ChatML, used when a model has no template of its own.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The model's template source (or ChatML).
pub fn template_of(model: &Model) -> String {
    model
        .file
        .get("tokenizer.chat_template")
        .and_then(|v| v.as_str())
        .map_or_else(|| CHATML.to_string(), str::to_string)
}

/// Renders `messages` with `template`; `add_generation_prompt` appends the assistant's turn
/// opening, as Hugging Face's `apply_chat_template` does.
pub fn render(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos: &str,
    eos: &str,
) -> Result<String> {
    let mut env = Environment::new();
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| LlmError::Invalid(format!("chat template: {e}")))?;
    let tmpl = env
        .get_template("chat")
        .map_err(|e| LlmError::Invalid(format!("chat template: {e}")))?;
    tmpl.render(minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    })
    .map_err(|e| LlmError::Invalid(format!("chat template: {e}")))
}

/// Renders a conversation for `model` with its own template.
pub fn apply(model: &Model, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
    let tk = &model.tokenizer;
    let text = |id: Option<u32>| id.map_or(String::new(), |i| tk.token_text(i).to_string());
    render(
        &template_of(model),
        messages,
        add_generation_prompt,
        &text(tk.bos()),
        &text(tk.eos()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_renders_turns_and_the_generation_prompt() {
        let m = [
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
        ];
        let s = render(CHATML, &m, true, "", "").unwrap();
        assert_eq!(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn template_errors_are_reported() {
        let e = render(
            "{{ raise_exception('no system role') }}",
            &[],
            false,
            "",
            "",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no system role"), "{e}");
        assert!(render("{% for %}", &[], false, "", "").is_err());
    }
}
