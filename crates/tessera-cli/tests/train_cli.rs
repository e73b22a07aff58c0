//! `tessera train` end to end: a small run writes a gpt2 GGUF that `tessera run` loads, a loss
//! curve, and an optimizer state that `--resume` continues; bad input is named.

use std::process::Command;

fn tessera(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("run tessera");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn train_writes_a_model_that_runs_and_resumes() {
    let dir = std::env::temp_dir().join(format!("tessera-train-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("text.txt");
    std::fs::write(
        &text,
        "Now is the winter of our discontent made glorious summer by this sun of York. ".repeat(40),
    )
    .unwrap();
    let out = dir.join("m.gguf");
    let (o, t) = (out.to_str().unwrap(), text.to_str().unwrap());
    let small = [
        "--data", t, "-o", o, "--ctx", "32", "--embd", "32", "--layers", "1", "--heads", "2", "-b",
        "4", "--quiet", "-t", "2", "--warmup", "2",
    ];
    let mut args = small.to_vec();
    args.extend(["--epochs", "2"]);
    let (code, _, err) = tessera(
        &["train"]
            .iter()
            .chain(args.iter())
            .copied()
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("epoch 1: train loss") && err.contains("epoch 2: train loss"),
        "{err}"
    );
    let loss = |err: &str, epoch: usize| -> f64 {
        let l = err
            .lines()
            .find(|l| l.starts_with(&format!("epoch {epoch}: train loss")))
            .unwrap();
        l.split_whitespace().nth(4).unwrap().parse().unwrap()
    };
    assert!(loss(&err, 2) < loss(&err, 1), "{err}");
    assert!(
        out.is_file() && dir.join("m.gguf.train.gguf").is_file() && dir.join("m.svg").is_file()
    );
    let svg = std::fs::read_to_string(dir.join("m.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    // the model loads and generates with the byte-level vocabulary
    let (code, stdout, err) = tessera(&[
        "run", "-m", o, "-p", "Now is", "-n", "8", "--temp", "0", "--ids",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.starts_with("Now is"), "{stdout}");
    let ids: Vec<u32> = err
        .lines()
        .rev()
        .find(|l| l.chars().all(|c| c.is_ascii_digit() || c == ' ') && !l.is_empty())
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 8);
    assert!(ids.iter().all(|&i| i <= 256), "byte-level ids: {ids:?}");
    // --resume continues to a third epoch
    let mut args = small.to_vec();
    args.extend(["--epochs", "3", "--resume"]);
    let (code, _, err) = tessera(
        &["train"]
            .iter()
            .chain(args.iter())
            .copied()
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("resuming at step")
            && err.contains("epoch 3: train loss")
            && !err.contains("epoch 1: train loss"),
        "{err}"
    );
    // bad input
    let (code, _, err) = tessera(&["train", "--data", "/nonexistent/x.txt", "-o", o, "--quiet"]);
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent/x.txt"), "{err}");
    let (code, _, err) = tessera(&[
        "train", "--data", t, "-o", o, "--embd", "30", "--heads", "4", "--quiet",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("multiple of n_head"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
