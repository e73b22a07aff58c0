//! The HTTP side: routes, the bearer-token check, request handling and server-sent events.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Map, Value};
use tessera_llm::{chat, Model};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::{self, ApiError, Endpoint, GenParams, Prompt};
use crate::engine::{Event, Job, TokenLogprob, Usage};

/// Largest request body accepted.
const MAX_BODY: usize = 8 << 20;

pub struct AppState {
    pub model: Arc<Model>,
    pub model_id: String,
    pub n_ctx_slot: usize,
    pub n_slots: usize,
    pub jobs: Sender<Job>,
    pub api_key: Option<String>,
    pub created: u64,
    pub counter: AtomicU64,
    pub slots: crate::engine::SlotTable,
}

type St = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/health", get(health))
        .route("/slots", get(slots))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state)
}

fn json_response(status: u16, v: &Value) -> Response {
    let mut r = Response::new(Body::from(v.to_string()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body())
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::invalid(
        None,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
    .status(404)
    .with_code("not_found")
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::invalid(
        None,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
    .status(405)
    .with_code("method_not_allowed")
}

/// With an API key, every request needs `Authorization: Bearer KEY` (compared in constant time).
async fn auth(State(st): St, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap_or("");
        if !api::same_secret(given.trim().as_bytes(), key.as_bytes()) {
            let mut e = ApiError::invalid(
                None,
                "invalid or missing API key (Authorization: Bearer KEY)",
            )
            .status(401)
            .with_code("invalid_api_key");
            e.kind = "authentication_error";
            return e.into_response();
        }
    }
    next.run(req).await
}

async fn health() -> Response {
    json_response(200, &json!({"status": "ok"}))
}

/// Each slot: whether it is processing a request, the tokens its cache holds, requests done.
async fn slots(State(st): St) -> Response {
    let t = st.slots.lock().map(|t| t.clone()).unwrap_or_default();
    let v: Vec<Value> = t
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": i, "state": if s.processing { "processing" } else { "idle" },
                             "n_cached": s.n_cached, "n_done": s.n_done})
        })
        .collect();
    json_response(200, &Value::Array(v))
}

async fn models(State(st): St) -> Response {
    json_response(
        200,
        &json!({"object": "list", "data": [{
            "id": st.model_id,
            "object": "model",
            "created": st.created,
            "owned_by": "tessera",
            "meta": {
                "n_ctx_slot": st.n_ctx_slot,
                "n_slots": st.n_slots,
                "n_vocab": st.model.hp.n_vocab,
                "n_params": st.model.n_params(),
                "architecture": st.model.arch.name(),
            },
        }]}),
    )
}

async fn body_object(body: Body) -> Result<Map<String, Value>, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        ApiError::invalid(None, format!("cannot read the request body: {e}"))
            .status(413)
            .with_code("body_too_large")
    })?;
    api::parse_object(&bytes)
}

fn check_ids(st: &AppState, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let nv = st.model.hp.n_vocab;
    match ids.iter().find(|&&t| t as usize >= nv) {
        Some(t) => Err(ApiError::invalid(
            Some(param),
            format!("token id {t} is outside the vocabulary of {nv}"),
        )
        .with_code("invalid_value")),
        None => Ok(()),
    }
}

fn token_list(obj: &Map<String, Value>, name: &str) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::invalid(
            Some(name),
            format!("'{name}' must be an array of token ids"),
        )
        .with_code("invalid_type")
    };
    match obj.get(name) {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(bad)
            })
            .collect(),
        _ => Err(bad()),
    }
}

async fn tokenize(State(st): St, body: Body) -> Result<Response, ApiError> {
    let obj = body_object(body).await?;
    let text = api::get_str(&obj, "content")?.ok_or_else(|| {
        ApiError::invalid(Some("content"), "'content' is required")
            .with_code("missing_required_parameter")
    })?;
    let add_special = api::get_bool(&obj, "add_special")?.unwrap_or(false);
    let pieces = api::get_bool(&obj, "with_pieces")?.unwrap_or(false);
    let ids = st.model.tokenizer.encode(text, add_special, true);
    let tokens: Vec<Value> = if pieces {
        ids.iter()
            .map(|&t| {
                let b = st.model.tokenizer.decode_token(t);
                json!({"id": t, "piece": String::from_utf8_lossy(&b)})
            })
            .collect()
    } else {
        ids.iter().map(|&t| json!(t)).collect()
    };
    Ok(json_response(200, &json!({ "tokens": tokens })))
}

async fn detokenize(State(st): St, body: Body) -> Result<Response, ApiError> {
    let obj = body_object(body).await?;
    let ids = token_list(&obj, "tokens")?;
    check_ids(&st, &ids, "tokens")?;
    Ok(json_response(
        200,
        &json!({"content": st.model.tokenizer.decode(&ids)}),
    ))
}

/// The model a request names must be ours (absent means ours).
fn check_model(st: &AppState, obj: &Map<String, Value>) -> Result<(), ApiError> {
    match api::get_str(obj, "model")? {
        Some(m) if m != st.model_id && m != st.model.name => Err(ApiError::invalid(
            Some("model"),
            format!(
                "the model '{m}' does not exist; this server serves '{}'",
                st.model_id
            ),
        )
        .status(404)
        .with_code("model_not_found")),
        _ => Ok(()),
    }
}

async fn chat_completions(State(st): St, body: Body) -> Result<Response, ApiError> {
    let obj = body_object(body).await?;
    check_model(&st, &obj)?;
    let params = api::gen_params(&obj, Endpoint::Chat)?;
    let msgs = api::messages(&obj)?;
    let text = chat::apply(&st.model, &msgs, true)
        .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
    let ids = st.model.tokenizer.encode(&text, true, true);
    generate(st, ids, params, Endpoint::Chat).await
}

async fn completions(State(st): St, body: Body) -> Result<Response, ApiError> {
    let obj = body_object(body).await?;
    check_model(&st, &obj)?;
    let params = api::gen_params(&obj, Endpoint::Completion)?;
    let ids = match api::prompt(&obj)? {
        Prompt::Text(t) => st.model.tokenizer.encode(&t, true, true),
        Prompt::Tokens(ids) => {
            check_ids(&st, &ids, "prompt")?;
            ids
        }
    };
    generate(st, ids, params, Endpoint::Completion).await
}

/// What every answer of one request shares.
struct Answer {
    ep: Endpoint,
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    include_usage: bool,
}

impl Answer {
    fn envelope(&self, object: &str, choice: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(object));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("system_fingerprint".into(), json!("tessera"));
        m.insert("choices".into(), Value::Array(vec![choice]));
        m
    }

    fn logprobs_json(&self, lps: &[TokenLogprob], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.ep {
            Endpoint::Chat => {
                let entry =
                    |t: &str, b: &[u8], lp: f32| json!({"token": t, "logprob": lp, "bytes": b});
                json!({"content": lps.iter().map(|l| {
                    let mut e = entry(&l.token, &l.bytes, l.logprob);
                    e["top_logprobs"] = Value::Array(l.top.iter().map(|(t, b, lp)| entry(t, b, *lp)).collect());
                    e
                }).collect::<Vec<_>>()})
            }
            Endpoint::Completion => {
                let mut off = offset;
                let mut offsets = Vec::new();
                for l in lps {
                    offsets.push(off);
                    off += l.token.len();
                }
                json!({
                    "tokens": lps.iter().map(|l| l.token.clone()).collect::<Vec<_>>(),
                    "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                    "top_logprobs": lps.iter().map(|l| {
                        Value::Object(l.top.iter().map(|(t, _, lp)| (t.clone(), json!(lp))).collect())
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }

    fn usage(u: &Usage) -> Value {
        json!({
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        })
    }

    /// A streamed chunk: new text, or the end (`finish`).
    fn chunk(
        &self,
        text: &str,
        lps: &[TokenLogprob],
        offset: usize,
        first: bool,
        finish: Option<&str>,
    ) -> Value {
        let lp = self.logprobs_json(lps, offset);
        let m = match self.ep {
            Endpoint::Chat => {
                let mut delta = Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if finish.is_none() || !text.is_empty() {
                    delta.insert("content".into(), json!(text));
                }
                self.envelope(
                    "chat.completion.chunk",
                    json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}),
                )
            }
            Endpoint::Completion => self.envelope(
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}),
            ),
        };
        Value::Object(m)
    }

    fn usage_chunk(&self, u: &Usage) -> Value {
        let object = match self.ep {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        let mut m = self.envelope(object, Value::Null);
        m.insert("choices".into(), json!([]));
        m.insert("usage".into(), Answer::usage(u));
        Value::Object(m)
    }

    fn whole(&self, text: &str, lps: &[TokenLogprob], finish: &str, u: &Usage) -> Value {
        let lp = self.logprobs_json(lps, 0);
        let mut m = match self.ep {
            Endpoint::Chat => self.envelope(
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": lp, "finish_reason": finish}),
            ),
            Endpoint::Completion => self.envelope(
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}),
            ),
        };
        m.insert("usage".into(), Answer::usage(u));
        Value::Object(m)
    }
}

async fn generate(
    st: Arc<AppState>,
    prompt: Vec<u32>,
    params: GenParams,
    ep: Endpoint,
) -> Result<Response, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            Some("prompt"),
            "the prompt is empty (no tokens)",
        ));
    }
    if prompt.len() >= st.n_ctx_slot {
        return Err(ApiError::invalid(
            Some(match ep {
                Endpoint::Chat => "messages",
                Endpoint::Completion => "prompt",
            }),
            format!(
                "the prompt is {} tokens; this server's context is {} tokens per slot, and at least one must be left to generate",
                prompt.len(),
                st.n_ctx_slot
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let n = st.counter.fetch_add(1, Ordering::Relaxed);
    let answer = Answer {
        ep,
        id: format!(
            "{}-{:x}{n:x}",
            match ep {
                Endpoint::Chat => "chatcmpl",
                Endpoint::Completion => "cmpl",
            },
            st.created
        ),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: st.model_id.clone(),
        logprobs: params.logprobs.is_some(),
        include_usage: params.include_usage,
    };
    let stream = params.stream;
    let (tx, mut rx) = unbounded_channel();
    st.jobs
        .send(Job {
            prompt,
            params,
            events: tx,
        })
        .map_err(|_| ApiError::server("the scheduler has stopped"))?;
    if stream {
        let mut r = Response::new(Body::from_stream(SseStream {
            rx,
            answer,
            first: true,
            offset: 0,
            done: false,
        }));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(r);
    }
    let mut text = String::new();
    let mut lps = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text { text: t, logprobs } => {
                text.push_str(&t);
                lps.extend(logprobs);
            }
            Event::Done {
                finish_reason,
                usage,
            } => {
                return Ok(json_response(
                    200,
                    &answer.whole(&text, &lps, finish_reason, &usage),
                ))
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err(ApiError::server("the scheduler dropped the request"))
}

/// The events of one request as server-sent events, ending with `data: [DONE]`. Dropping it
/// (the client went away) closes the channel, which the scheduler sees and frees the slot.
struct SseStream {
    rx: UnboundedReceiver<Event>,
    answer: Answer,
    first: bool,
    offset: usize,
    done: bool,
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

impl futures_core::Stream for SseStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let ev = match self.rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(ev) => ev,
        };
        let s = &mut *self;
        let out = match ev {
            Some(Event::Text { text, logprobs }) => {
                if text.is_empty() && logprobs.is_empty() {
                    String::new()
                } else {
                    let c = s.answer.chunk(&text, &logprobs, s.offset, s.first, None);
                    s.first = false;
                    s.offset += text.len();
                    sse(&c)
                }
            }
            Some(Event::Done {
                finish_reason,
                usage,
            }) => {
                s.done = true;
                let mut o = sse(&s
                    .answer
                    .chunk("", &[], s.offset, s.first, Some(finish_reason)));
                if s.answer.include_usage {
                    o.push_str(&sse(&s.answer.usage_chunk(&usage)));
                }
                o + "data: [DONE]\n\n"
            }
            Some(Event::Error(e)) => {
                s.done = true;
                sse(&e.body()) + "data: [DONE]\n\n"
            }
            None => {
                s.done = true;
                sse(&ApiError::server("the scheduler dropped the request").body())
            }
        };
        Poll::Ready(Some(Ok(Bytes::from(out))))
    }
}
