//! `tessera serve`: the OpenAI-compatible HTTP server of `tessera-server`.

use crate::llm_cmd::{self, CmdResult, ModelArgs};

#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Slots: requests decoded together; `-c` is divided among them (as llama-server's -np).
    #[arg(
        long = "parallel",
        short = 'P',
        visible_alias = "np",
        default_value_t = 1
    )]
    pub parallel: usize,
    /// Require `Authorization: Bearer KEY` on every request.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
}

pub fn serve(args: &ServeArgs) -> CmdResult {
    let (model, context) = llm_cmd::load(&args.model)?;
    let path = match &args.model.model {
        Some(p) => p.clone(),
        None => tessera_llm::fetch::default_model()?,
    };
    let cfg = tessera_server::Config {
        model: path,
        host: args.host.clone(),
        port: args.port,
        parallel: args.parallel,
        n_ctx: args.model.ctx,
        context,
        api_key: args.api_key.clone(),
    };
    let server = tessera_server::start_with(cfg, model)?;
    eprintln!(
        "tessera serve: {} slots of {} tokens, listening on http://{}",
        args.parallel,
        args.model.ctx / args.parallel.max(1),
        server.addr()
    );
    server.wait()
}
