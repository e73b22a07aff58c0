//! The `openai` Python package against a server started here: chat, streaming, stop
//! sequences, usage, errors (`tests/python/openai_client.py`).
//!
//! The package is installed once with pip into `$TESSERA_CACHE/py-openai` (or
//! `$TESSERA_OPENAI_DIR`), as the model is fetched. With the model present, a failure to
//! install or run it fails the test: nothing is skipped silently.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn openai_dir() -> PathBuf {
    let dir = std::env::var_os("TESSERA_OPENAI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tessera_llm::fetch::cache_dir().join("py-openai"));
    if !dir.join("openai").join("__init__.py").is_file() {
        let st = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&dir)
            .arg("openai")
            .status()
            .expect("run python3 -m pip");
        assert!(
            st.success(),
            "pip install --target {dir:?} openai failed ({st})"
        );
    }
    dir
}

#[test]
fn the_openai_python_client_works_against_tessera_serve() {
    let Some(model) = common::model() else { return };
    let dir = openai_dir();
    let srv = common::server(&model, 2, 512, Some("test-key"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py");
    let out = Command::new("python3")
        .arg(&script)
        .env("PYTHONPATH", &dir)
        .env("TESSERA_BASE_URL", format!("http://{}/v1", srv.addr()))
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("11 checks passed"), "{stdout}");
}
