//! `tessera serve` over raw HTTP: the endpoints, streaming, stop sequences, usage, bad input,
//! the API key, concurrent requests, prefix reuse and client disconnects, on the default model
//! (found as tessera-llm's tests find it; required when `TESSERA_REQUIRE_MODEL` is set).

mod common;

use std::io::{BufReader, Write};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// llama.cpp's greedy continuation of "Once upon a time" on this model (see tessera-llm's
/// smollm2 test): ", the city of New Haven".
const GREEDY: [u32; 6] = [28, 260, 2240, 282, 1315, 27108];

#[test]
fn endpoints_answer_like_openai_and_bad_input_gets_4xx() {
    let Some(model) = model() else { return };
    let srv = server(&model, 2, 512, None);
    let a = srv.addr();
    let expected = model.tokenizer.decode(&GREEDY);
    assert_eq!(expected, ", the city of New Haven");

    let r = get(a, "/health");
    assert_eq!((r.status, r.json()), (200, json!({"status": "ok"})));
    let r = get(a, "/v1/models");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");

    // tokenize / detokenize
    let r = post(a, "/tokenize", r#"{"content":"Once upon a time"}"#);
    assert_eq!(r.json()["tokens"], json!([6403, 1980, 253, 655]));
    let r = post(a, "/detokenize", r#"{"tokens":[6403, 1980, 253, 655]}"#);
    assert_eq!(r.json()["content"], "Once upon a time");

    // a greedy completion, whole
    let body = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "Once upon a time",
                      "temperature": 0, "max_tokens": 6});
    let r = post(a, "/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], expected);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["usage"]["total_tokens"], 10);

    // the same, streamed: chunks add up to the same text, then [DONE]
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let r = post(a, "/v1/completions", &sbody.to_string());
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let ev = r.events();
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, expected);
    assert!(
        chunks.len() >= 7,
        "one chunk per token at least: {}",
        r.body
    );
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        (
            usage["prompt_tokens"].as_u64(),
            usage["completion_tokens"].as_u64()
        ),
        (Some(4), Some(6))
    );

    // stop sequences end the text before them, streamed or not, and never leak into a chunk
    let mut stop = body.clone();
    stop["stop"] = json!(["city"]);
    let v = post(a, "/v1/completions", &stop.to_string()).json();
    assert_eq!(v["choices"][0]["text"], ", the ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    sbody["stop"] = json!(" New");
    let r = post(a, "/v1/completions", &sbody.to_string());
    let text: String = r.events()[..r.events().len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, ", the city of");

    // logprobs: the greedy token is the most likely one
    let mut lp = body.clone();
    lp["logprobs"] = json!(2);
    lp["max_tokens"] = json!(2);
    let v = post(a, "/v1/completions", &lp.to_string()).json();
    let l = &v["choices"][0]["logprobs"];
    assert_eq!(l["tokens"], json!([",", " the"]));
    let first = l["token_logprobs"][0].as_f64().unwrap();
    assert!(first < 0.0 && first > -5.0, "{first}");
    assert_eq!(l["top_logprobs"][0][","].as_f64(), Some(first));

    // chat, with the model's template
    let chat = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "temperature": 0, "max_tokens": 8,
                      "messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "logprobs": true, "top_logprobs": 1});
    let r = post(a, "/v1/chat/completions", &chat.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty());
    let n_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n_prompt > 10, "the template wraps the message: {n_prompt}");
    assert_eq!(
        v["choices"][0]["logprobs"]["content"]
            .as_array()
            .map(Vec::len),
        v["usage"]["completion_tokens"].as_u64().map(|n| n as usize)
    );

    // bad input: 4xx with an OpenAI error body naming the parameter
    let long = "word ".repeat(600);
    let cases: Vec<(&str, String, u16, Option<&str>, Option<&str>)> = vec![
        (
            "/v1/completions",
            "{\"prompt\": \"hi\",".into(),
            400,
            None,
            Some("invalid_json"),
        ),
        ("/v1/completions", "[1, 2]".into(), 400, None, None),
        (
            "/v1/completions",
            r#"{"prompt":"hi","temperature":"hot"}"#.into(),
            400,
            Some("temperature"),
            Some("invalid_type"),
        ),
        (
            "/v1/completions",
            r#"{"prompt":"hi","max_tokens":"5"}"#.into(),
            400,
            Some("max_tokens"),
            Some("invalid_type"),
        ),
        (
            "/v1/completions",
            r#"{"prompt":"hi","top_p":1.5}"#.into(),
            400,
            Some("top_p"),
            Some("invalid_value"),
        ),
        (
            "/v1/completions",
            r#"{"prompt":"hi","temperature":-1}"#.into(),
            400,
            Some("temperature"),
            Some("invalid_value"),
        ),
        (
            "/v1/completions",
            r#"{"prompt":"hi","presence_penalty":3}"#.into(),
            400,
            Some("presence_penalty"),
            Some("invalid_value"),
        ),
        (
            "/v1/completions",
            r#"{"prompt":"hi","max_tokens":0}"#.into(),
            400,
            Some("max_tokens"),
            Some("invalid_value"),
        ),
        (
            "/v1/completions",
            r#"{"prompt":"hi","n":3}"#.into(),
            400,
            Some("n"),
            Some("unsupported_value"),
        ),
        (
            "/v1/completions",
            r#"{"prompt":"hi","model":"gpt-4"}"#.into(),
            404,
            Some("model"),
            Some("model_not_found"),
        ),
        (
            "/v1/completions",
            r#"{"prompt":[1,99999999]}"#.into(),
            400,
            Some("prompt"),
            Some("invalid_value"),
        ),
        (
            "/v1/completions",
            r#"{"max_tokens":3}"#.into(),
            400,
            Some("prompt"),
            Some("missing_required_parameter"),
        ),
        (
            "/v1/completions",
            json!({"prompt": long}).to_string(),
            400,
            Some("prompt"),
            Some("context_length_exceeded"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":"hi"}"#.into(),
            400,
            Some("messages"),
            Some("invalid_type"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"stop":[1]}"#.into(),
            400,
            Some("stop"),
            Some("invalid_type"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"top_logprobs":30,"logprobs":true}"#
                .into(),
            400,
            Some("top_logprobs"),
            Some("invalid_value"),
        ),
        (
            "/detokenize",
            r#"{"tokens":[70000]}"#.into(),
            400,
            Some("tokens"),
            Some("invalid_value"),
        ),
        (
            "/tokenize",
            r#"{"content":5}"#.into(),
            400,
            Some("content"),
            Some("invalid_type"),
        ),
        ("/v1/nothing", "{}".into(), 404, None, Some("not_found")),
    ];
    for (path, body, status, param, code) in cases {
        let r = post(a, path, &body);
        assert_eq!(r.status, status, "{path} {body}: {}", r.body);
        let e = &r.json()["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}",
            r.body
        );
        assert_eq!(e["type"], "invalid_request_error", "{}", r.body);
        assert_eq!(e["param"].as_str(), param, "{path} {body}: {}", r.body);
        assert_eq!(e["code"].as_str(), code, "{path} {body}: {}", r.body);
    }
    let r = get(a, "/v1/completions");
    assert_eq!(r.status, 405);
    // still serving, with the same answer
    let v = post(a, "/v1/completions", &body.to_string()).json();
    assert_eq!(v["choices"][0]["text"], expected);
}

#[test]
fn the_api_key_is_required_on_every_request() {
    let Some(model) = model() else { return };
    let srv = server(&model, 1, 256, Some("s3cret"));
    let a = srv.addr();
    for path in ["/health", "/v1/models"] {
        let r = get(a, path);
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        let r = request(a, "GET", path, &[("Authorization", "Bearer s3creT")], "");
        assert_eq!(r.status, 401);
        let r = request(a, "GET", path, &[("Authorization", "Bearer s3cret")], "");
        assert_eq!(r.status, 200);
    }
    let r = request(
        a,
        "POST",
        "/v1/completions",
        &[],
        r#"{"prompt":"Hi","max_tokens":1}"#,
    );
    assert_eq!(r.status, 401);
}

/// Completion text of a greedy request on `prompt`.
fn greedy_body(prompt: &str, n: usize, stream: bool) -> String {
    json!({"prompt": prompt, "temperature": 0, "max_tokens": n, "stream": stream}).to_string()
}

#[test]
fn concurrent_requests_queue_batch_and_give_their_single_answers() {
    let Some(model) = model() else { return };
    let srv = server(&model, 2, 512, None);
    let a = srv.addr();
    let prompts = [
        "Once upon a time",
        "The capital of France is",
        "def fibonacci(n):",
    ];
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            post(a, "/v1/completions", &greedy_body(p, 8, false)).json()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    // 6 clients on 2 slots: 4 wait in the queue, none fails, each gets its single answer
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let p = prompts[i % 3];
            std::thread::spawn(move || post(a, "/v1/completions", &greedy_body(p, 8, i % 2 == 0)))
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        let text = if i % 2 == 0 {
            r.events()[..r.events().len() - 1]
                .iter()
                .map(|e| serde_json::from_str::<Value>(e).unwrap())
                .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
                .collect()
        } else {
            r.json()["choices"][0]["text"].as_str().unwrap().to_string()
        };
        assert_eq!(text, alone[i % 3], "client {i}");
    }
    // a prompt that extends a cached one reuses the cached prefix
    let long = "Once upon a time there was a dragon";
    let r = post(a, "/v1/completions", &greedy_body(long, 2, false)).json();
    let r2 = post(
        a,
        "/v1/completions",
        &greedy_body(&format!("{long} who"), 2, false),
    )
    .json();
    let cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        cached,
        r["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{r2}"
    );
}

#[test]
fn a_client_that_disconnects_frees_its_slot() {
    let Some(model) = model() else { return };
    let srv = server(&model, 1, 2048, None);
    let a = srv.addr();
    let body = greedy_body("Once upon a time", 2000, true);
    let mut s = connect(a);
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 200);
    let first = read_chunk(&mut r).expect("a first chunk");
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    let slot = |a| get(a, "/slots").json()[0].clone();
    assert_eq!(slot(a)["state"], "processing");
    drop(r);
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    // 2000 tokens would take many seconds; the slot is free long before
    let t = Instant::now();
    while slot(a)["state"] != "idle" {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the slot is still busy"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = slot(a);
    assert!(s["n_cached"].as_u64().unwrap() < 1000, "{s}");
    // and the next request is served
    let r = post(
        a,
        "/v1/completions",
        &greedy_body("Once upon a time", 2, false),
    );
    assert_eq!(r.json()["choices"][0]["text"], ", the");
}
