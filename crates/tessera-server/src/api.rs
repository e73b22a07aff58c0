//! The OpenAI request fields: parsing with errors that name the parameter, and the error body
//! `{"error": {"message", "type", "param", "code"}}`.

use serde_json::{json, Map, Value};
use tessera_llm::SamplerParams;

/// An error answered to the client (always 4xx but for a broken server).
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn status(mut self, status: u16) -> ApiError {
        self.status = status;
        self
    }

    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 500,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// A JSON object parsed from a request body.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(None, format!("the request body is not valid JSON: {e}"))
            .with_code("invalid_json")
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::invalid(
            None,
            format!(
                "the request body must be a JSON object, not {}",
                type_name(&other)
            ),
        )),
    }
}

pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(name: &str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        Some(name),
        format!("'{name}' must be {want}, not {}", type_name(got)),
    )
    .with_code("invalid_type")
}

/// Field `name` of `obj`, absent when missing or null.
fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

pub fn get_bool(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong_type(name, "a boolean", v)),
    }
}

pub fn get_str<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(wrong_type(name, "a string", v)),
    }
}

/// A number in `[lo, hi]`.
pub fn get_num(
    obj: &Map<String, Value>,
    name: &str,
    lo: f64,
    hi: f64,
) -> Result<Option<f64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v @ Value::Number(n)) => {
            let x = n.as_f64().ok_or_else(|| wrong_type(name, "a number", v))?;
            if !(lo..=hi).contains(&x) {
                return Err(out_of_range(name, x, lo, hi));
            }
            Ok(Some(x))
        }
        Some(v) => Err(wrong_type(name, "a number", v)),
    }
}

fn out_of_range(name: &str, x: impl std::fmt::Display, lo: f64, hi: f64) -> ApiError {
    let hi = if hi >= i64::MAX as f64 {
        "∞".to_string()
    } else {
        hi.to_string()
    };
    ApiError::invalid(
        Some(name),
        format!("'{name}' must be in [{lo}, {hi}], got {x}"),
    )
    .with_code("invalid_value")
}

/// An integer in `[lo, hi]`.
pub fn get_int(
    obj: &Map<String, Value>,
    name: &str,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v @ Value::Number(n)) => {
            let x = n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
                .ok_or_else(|| wrong_type(name, "an integer", v))?;
            if !(lo..=hi).contains(&x) {
                return Err(out_of_range(name, x, lo as f64, hi as f64));
            }
            Ok(Some(x))
        }
        Some(v) => Err(wrong_type(name, "an integer", v)),
    }
}

/// What a generation request asks for, beyond its prompt.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub sampler: SamplerParams,
    /// Tokens to generate at most (the context's end stops it anyway).
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Some(k): each token's log-probability and its `k` most likely alternatives.
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Which endpoint a request came to: their fields and answers differ a little.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// The fields both endpoints share. Defaults are llama-server's (temperature 0.8, top_k 40,
/// top_p 0.95, min_p 0.05; no limit on tokens but the context).
pub fn gen_params(obj: &Map<String, Value>, ep: Endpoint) -> Result<GenParams, ApiError> {
    if let Some(n) = get_int(obj, "n", i64::MIN, i64::MAX)? {
        if n != 1 {
            return Err(
                ApiError::invalid(Some("n"), format!("only n = 1 is supported, got {n}"))
                    .with_code("unsupported_value"),
            );
        }
    }
    let d = SamplerParams::default();
    let seed = match field(obj, "seed") {
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_nanos() as u64),
        Some(v @ Value::Number(n)) => n
            .as_u64()
            .or_else(|| n.as_i64().map(|x| x as u64))
            .ok_or_else(|| wrong_type("seed", "an integer", v))?,
        Some(v) => return Err(wrong_type("seed", "an integer", v)),
    };
    let max_tokens = match ep {
        Endpoint::Chat => get_int(obj, "max_completion_tokens", 1, i64::MAX)?.or(get_int(
            obj,
            "max_tokens",
            1,
            i64::MAX,
        )?),
        Endpoint::Completion => get_int(obj, "max_tokens", 1, i64::MAX)?,
    };
    let sampler = SamplerParams {
        temp: get_num(obj, "temperature", 0.0, 2.0)?.map_or(d.temp, |x| x as f32),
        top_k: get_int(obj, "top_k", 0, 1 << 20)?.map_or(d.top_k, |x| x as usize),
        top_p: get_num(obj, "top_p", 0.0, 1.0)?.map_or(d.top_p, |x| x as f32),
        min_p: get_num(obj, "min_p", 0.0, 1.0)?.map_or(d.min_p, |x| x as f32),
        repeat_penalty: get_num(obj, "repeat_penalty", 0.01, 10.0)?
            .map_or(d.repeat_penalty, |x| x as f32),
        frequency_penalty: get_num(obj, "frequency_penalty", -2.0, 2.0)?
            .map_or(d.frequency_penalty, |x| x as f32),
        presence_penalty: get_num(obj, "presence_penalty", -2.0, 2.0)?
            .map_or(d.presence_penalty, |x| x as f32),
        penalty_last_n: d.penalty_last_n,
        seed,
    };
    sampler
        .validate()
        .map_err(|e| ApiError::invalid(None, e).with_code("invalid_value"))?;
    let stop = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > 4 {
                return Err(ApiError::invalid(
                    Some("stop"),
                    format!("'stop' takes at most 4 sequences, got {}", a.len()),
                )
                .with_code("invalid_value"));
            }
            a.iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(wrong_type("stop", "a string or an array of strings", v)),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => return Err(wrong_type("stop", "a string or an array of strings", v)),
    };
    if stop.iter().any(String::is_empty) {
        return Err(
            ApiError::invalid(Some("stop"), "stop sequences must not be empty")
                .with_code("invalid_value"),
        );
    }
    let logprobs = match ep {
        Endpoint::Chat => {
            let on = get_bool(obj, "logprobs")?.unwrap_or(false);
            let top = get_int(obj, "top_logprobs", 0, 20)?;
            if top.is_some() && !on {
                return Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "'top_logprobs' needs 'logprobs': true",
                )
                .with_code("invalid_value"));
            }
            on.then_some(top.unwrap_or(0) as usize)
        }
        Endpoint::Completion => get_int(obj, "logprobs", 0, 5)?.map(|k| k as usize),
    };
    let include_usage = match field(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => get_bool(o, "include_usage")?.unwrap_or(false),
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };
    Ok(GenParams {
        sampler,
        max_tokens: max_tokens.map_or(usize::MAX, |x| x as usize),
        stop,
        logprobs,
        stream: get_bool(obj, "stream")?.unwrap_or(false),
        include_usage,
    })
}

/// The conversation of a chat request: `messages`, each with a string `role` and a `content`
/// that is a string or an array of text parts.
pub fn messages(obj: &Map<String, Value>) -> Result<Vec<tessera_llm::chat::Message>, ApiError> {
    let arr = match field(obj, "messages") {
        None => {
            return Err(
                ApiError::invalid(Some("messages"), "'messages' is required")
                    .with_code("missing_required_parameter"),
            )
        }
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("messages", "an array", v)),
    };
    if arr.is_empty() {
        return Err(ApiError::invalid(
            Some("messages"),
            "'messages' must hold at least one message",
        ));
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let param = format!("messages[{i}]");
        let Value::Object(m) = m else {
            return Err(wrong_type(&param, "an object", m));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.clone(),
            Some(v) => return Err(wrong_type(&format!("{param}.role"), "a string", v)),
            None => {
                return Err(ApiError::invalid(
                    Some(&format!("{param}.role")),
                    format!("{param} has no 'role'"),
                ))
            }
        };
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match p.get("text") {
                        Some(Value::String(t))
                            if p.get("type").and_then(Value::as_str) == Some("text") =>
                        {
                            s.push_str(t)
                        }
                        _ => {
                            return Err(ApiError::invalid(
                                Some(&format!("{param}.content")),
                                "content parts must be {\"type\": \"text\", \"text\": ...}",
                            ))
                        }
                    }
                }
                s
            }
            Some(v) => {
                return Err(wrong_type(
                    &format!("{param}.content"),
                    "a string or an array of text parts",
                    v,
                ))
            }
        };
        out.push(tessera_llm::chat::Message { role, content });
    }
    Ok(out)
}

/// The prompt of a completion request: a string, an array of token ids, or an array holding
/// one of those.
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

pub fn prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let bad = |v: &Value| wrong_type("prompt", "a string or an array of token ids", v);
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| bad(x))
            })
            .collect()
    };
    match field(obj, "prompt") {
        None => Err(ApiError::invalid(Some("prompt"), "'prompt' is required")
            .with_code("missing_required_parameter")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) => match a.first() {
            Some(Value::Number(_)) => Ok(Prompt::Tokens(ids(a)?)),
            Some(first) if a.len() > 1 => Err(ApiError::invalid(
                Some("prompt"),
                format!(
                    "one prompt per request (n = 1); got an array of {} {}",
                    a.len(),
                    match first {
                        Value::String(_) => "strings",
                        _ => "arrays",
                    }
                ),
            )
            .with_code("unsupported_value")),
            Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
            Some(Value::Array(inner)) => Ok(Prompt::Tokens(ids(inner)?)),
            Some(v) => Err(bad(v)),
            None => Err(ApiError::invalid(Some("prompt"), "the prompt is empty")),
        },
        Some(v) => Err(bad(v)),
    }
}

/// Constant-time comparison (the time depends only on the lengths).
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xFF);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(s: &str) -> Map<String, Value> {
        parse_object(s.as_bytes()).unwrap()
    }

    #[test]
    fn parameters_are_checked_and_named() {
        let p = gen_params(
            &obj(r#"{"temperature":0,"top_k":3,"stop":["a","b"],"max_tokens":5,"seed":7}"#),
            Endpoint::Completion,
        )
        .unwrap();
        assert_eq!((p.sampler.temp, p.sampler.top_k, p.max_tokens), (0.0, 3, 5));
        assert_eq!(p.stop, ["a", "b"]);
        assert_eq!(p.sampler.seed, 7);
        let e = gen_params(&obj(r#"{"temperature":"hot"}"#), Endpoint::Chat).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(
            e.message.contains("must be a number, not a string"),
            "{}",
            e.message
        );
        let e = gen_params(&obj(r#"{"top_p":1.5}"#), Endpoint::Chat).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("top_p")));
        let e = gen_params(&obj(r#"{"n":2}"#), Endpoint::Chat).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        let e = gen_params(&obj(r#"{"max_tokens":-1}"#), Endpoint::Chat).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = gen_params(&obj(r#"{"stop":["a",1]}"#), Endpoint::Chat).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        let e = gen_params(&obj(r#"{"top_logprobs":2}"#), Endpoint::Chat).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        assert!(parse_object(b"[1]").is_err());
        assert_eq!(parse_object(b"{").unwrap_err().code, Some("invalid_json"));
    }

    #[test]
    fn messages_and_prompts() {
        let m = messages(&obj(
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
        ))
        .unwrap();
        assert_eq!(m[0].content, "hi");
        assert!(messages(&obj(r#"{"messages":[{"content":"x"}]}"#)).is_err());
        assert!(
            matches!(prompt(&obj(r#"{"prompt":[1,2]}"#)), Ok(Prompt::Tokens(t)) if t == [1, 2])
        );
        assert!(prompt(&obj(r#"{"prompt":["a","b"]}"#)).is_err());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }
}
