//! `tessera serve`: an OpenAI-compatible HTTP server (tokio + axum).
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions` (streamed as server-sent events ending
//!   with `data: [DONE]`, or whole), `GET /v1/models`, `GET /health`, `POST /tokenize`,
//!   `POST /detokenize`.
//! - `--parallel N` slots share one multi-sequence KV cache (`tessera_llm::batch`); a scheduler
//!   thread decodes every running request's next token in one batch (continuous batching),
//!   queues requests while all slots are busy, drops a request whose client disconnected, and
//!   reuses the longest cached prompt prefix of a free slot.
//! - Bad requests get a 4xx with `{"error": {"message", "type", "param", "code"}}`.
//!
//! ```no_run
//! let server = tessera_server::start(tessera_server::Config {
//!     model: "SmolLM2-135M-Instruct.Q4_1.gguf".into(),
//!     port: 0, // any free port
//!     ..Default::default()
//! }).unwrap();
//! println!("http://{}", server.addr());
//! server.wait();
//! ```

pub mod api;
pub mod engine;
pub mod http;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::JoinHandle;

use tessera_llm::batch::BatchContext;
use tessera_llm::{ContextParams, Model};

/// How to serve.
#[derive(Clone, Debug)]
pub struct Config {
    pub model: PathBuf,
    pub host: String,
    /// 0: any free port (see `Server::addr`).
    pub port: u16,
    /// Slots: requests decoded at once.
    pub parallel: usize,
    /// Context positions in all, divided among the slots (as llama-server's `-c`).
    pub n_ctx: usize,
    /// Other context options (`n_ctx` there is ignored; `n_batch` bounds one step's tokens).
    pub context: ContextParams,
    /// When set, every request needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            model: PathBuf::new(),
            host: "127.0.0.1".into(),
            port: 8080,
            parallel: 1,
            n_ctx: 4096,
            context: ContextParams::default(),
            api_key: None,
        }
    }
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    http: Option<JoinHandle<Result<(), String>>>,
}

impl Server {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server stops (it stops on its own only on an I/O error).
    pub fn wait(mut self) -> Result<(), String> {
        match self.http.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err("the HTTP thread panicked".into()),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // stops accepting; requests in flight finish on the HTTP thread
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
    }
}

/// The id `/v1/models` lists: the file name without `.gguf`.
pub fn model_id(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| "model".into())
}

/// Loads the model, binds, and serves on background threads (a scheduler and the HTTP
/// runtime); returns once the socket listens.
pub fn start(cfg: Config) -> Result<Server, String> {
    let model =
        Arc::new(Model::load(&cfg.model).map_err(|e| format!("{}: {e}", cfg.model.display()))?);
    start_with(cfg, model)
}

/// `start` with the model already loaded (from `cfg.model`).
pub fn start_with(cfg: Config, model: Arc<Model>) -> Result<Server, String> {
    if cfg.parallel == 0 {
        return Err("--parallel must be at least 1".into());
    }
    let n_ctx_slot = cfg.n_ctx / cfg.parallel;
    if n_ctx_slot < 2 {
        return Err(format!(
            "a context of {} positions leaves {n_ctx_slot} per slot for {} slots",
            cfg.n_ctx, cfg.parallel
        ));
    }
    let params = ContextParams {
        n_ctx: n_ctx_slot,
        ..cfg.context.clone()
    };
    let listener = std::net::TcpListener::bind((cfg.host.as_str(), cfg.port))
        .map_err(|e| format!("cannot listen on {}:{}: {e}", cfg.host, cfg.port))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (jobs, rx) = std::sync::mpsc::channel();
    // the context lives on the scheduler thread (its backend is not Send)
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let m = Arc::clone(&model);
    let parallel = cfg.parallel;
    let slots = engine::SlotTable::default();
    let t = Arc::clone(&slots);
    std::thread::Builder::new()
        .name("tessera-scheduler".into())
        .spawn(move || match BatchContext::new(m, params, parallel) {
            Ok(ctx) => {
                let _ = ready_tx.send(Ok(()));
                engine::Engine::new(ctx, t).run(rx)
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e.to_string()));
            }
        })
        .map_err(|e| e.to_string())?;
    ready_rx
        .recv()
        .map_err(|_| "the scheduler thread stopped".to_string())??;
    let state = Arc::new(http::AppState {
        model_id: model_id(&cfg.model),
        model,
        n_ctx_slot,
        n_slots: cfg.parallel,
        jobs,
        api_key: cfg.api_key.clone(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        counter: AtomicU64::new(0),
        slots,
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let http = std::thread::Builder::new()
        .name("tessera-http".into())
        .spawn(move || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
                axum::serve(listener, http::router(state))
                    .with_graceful_shutdown(async {
                        let _ = stop_rx.await;
                    })
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .map_err(|e| e.to_string())?;
    Ok(Server {
        addr,
        shutdown: Some(stop_tx),
        http: Some(http),
    })
}
