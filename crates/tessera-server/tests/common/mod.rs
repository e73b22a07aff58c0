//! A raw HTTP/1.1 client over std's TcpStream, and a server on the default model for tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tessera_llm::{ContextParams, Model};

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent-event body.
    pub fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s
}

/// Sends one request on a new connection (`Connection: close`) and reads the whole reply.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut s = connect(addr);
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    read_reply(&mut BufReader::new(s))
}

pub fn post(addr: SocketAddr, path: &str, body: &str) -> Reply {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body,
    )
}

pub fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, &[], "")
}

pub fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// Reads one chunk of a chunked body (None at the end).
pub fn read_chunk(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let n =
        usize::from_str_radix(line.trim(), 16).unwrap_or_else(|_| panic!("chunk size {line:?}"));
    let mut buf = vec![0; n + 2];
    r.read_exact(&mut buf).unwrap();
    buf.truncate(n);
    (n > 0).then_some(buf)
}

fn read_reply(r: &mut impl BufRead) -> Reply {
    let (status, headers) = read_head(r);
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        while let Some(c) = read_chunk(r) {
            body.extend(c);
        }
    } else {
        r.read_to_end(&mut body).unwrap();
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(body).expect("UTF-8 body"),
    }
}

/// The default model (None when absent and not required, see `model_for_tests`).
pub fn model() -> Option<Arc<Model>> {
    let path = tessera_llm::fetch::model_for_tests()?;
    Some(Arc::new(Model::load(&path).expect("load the model")))
}

/// A server on port 0 with `parallel` slots of `ctx_per_slot` tokens, 2 threads.
pub fn server(
    model: &Arc<Model>,
    parallel: usize,
    ctx_per_slot: usize,
    api_key: Option<&str>,
) -> tessera_server::Server {
    let path = tessera_llm::fetch::model_for_tests().expect("model");
    tessera_server::start_with(
        tessera_server::Config {
            model: path,
            port: 0,
            parallel,
            n_ctx: ctx_per_slot * parallel,
            context: ContextParams {
                n_threads: 2,
                ..Default::default()
            },
            api_key: api_key.map(str::to_string),
            ..Default::default()
        },
        Arc::clone(model),
    )
    .expect("start the server")
}
