//! Multi-sequence batches (`tessera_llm::batch`) against one sequence at a time, on the default
//! model (found as in `smollm2.rs`; required when `TESSERA_REQUIRE_MODEL` is set).

use std::sync::Arc;

use tessera_llm::batch::{BatchContext, SeqTokens};
use tessera_llm::{Context, ContextParams, Model, Sampler, SamplerParams};

fn greedy_alone(model: &Arc<Model>, prompt: &[u32], n: usize) -> Vec<u32> {
    let params = ContextParams {
        n_ctx: 256,
        n_threads: 2,
        ..Default::default()
    };
    let mut ctx = Context::new(Arc::clone(model), params).unwrap();
    let mut s = Sampler::new(SamplerParams {
        temp: 0.0,
        ..Default::default()
    });
    let mut logits = ctx.eval(prompt, false).unwrap().to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = s.sample(&logits);
        out.push(t);
        logits = ctx.eval(&[t], false).unwrap().to_vec();
    }
    out
}

#[test]
fn sequences_decoded_together_give_the_tokens_they_give_alone() {
    let Some(path) = tessera_llm::fetch::model_for_tests() else {
        return;
    };
    let model = Arc::new(Model::load(&path).unwrap());
    let tk = &model.tokenizer;
    let prompts: Vec<Vec<u32>> = [
        "Once upon a time",
        "The capital of France is",
        "def fibonacci(n):",
    ]
    .iter()
    .map(|p| tk.encode(p, true, false))
    .collect();
    let n = 12;
    let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy_alone(&model, p, n)).collect();
    // the first sequence, alone, is llama.cpp's continuation (see smollm2.rs)
    assert_eq!(
        alone[0][..n],
        tessera_llm::testing::GREEDY_LLAMA_CPP_AVX2[..n]
    );

    let params = ContextParams {
        n_ctx: 256,
        n_threads: 2,
        ..Default::default()
    };
    // 4 sequences, of which 3 are used: sequence 1 stays empty and 3 joins late
    let mut ctx = BatchContext::new(Arc::clone(&model), params, 4).unwrap();
    let seqs = [0usize, 2, 3];
    let mut samplers: Vec<Sampler> = (0..3)
        .map(|_| {
            Sampler::new(SamplerParams {
                temp: 0.0,
                ..Default::default()
            })
        })
        .collect();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 3];
    // step 0: the first two prompts together
    let l = ctx
        .eval(&[
            SeqTokens {
                seq: seqs[0],
                tokens: &prompts[0],
                logits: true,
            },
            SeqTokens {
                seq: seqs[1],
                tokens: &prompts[1],
                logits: true,
            },
        ])
        .unwrap()
        .to_vec();
    let nv = model.hp.n_vocab;
    assert_eq!(l.len(), 2 * nv);
    let mut last: Vec<Option<u32>> = vec![None; 3];
    for i in 0..2 {
        let t = samplers[i].sample(&l[i * nv..(i + 1) * nv]);
        got[i].push(t);
        last[i] = Some(t);
    }
    // then: one token for each running sequence, plus the third prompt at step 3
    for step in 1..n + 3 {
        let mut entries = Vec::new();
        let mut who = Vec::new();
        let toks: Vec<[u32; 1]> = last.iter().map(|t| [t.unwrap_or(0)]).collect();
        for i in 0..3 {
            if last[i].is_some() && got[i].len() < n {
                entries.push(SeqTokens {
                    seq: seqs[i],
                    tokens: &toks[i],
                    logits: true,
                });
                who.push(i);
            }
        }
        if step == 3 {
            entries.push(SeqTokens {
                seq: seqs[2],
                tokens: &prompts[2],
                logits: true,
            });
            who.push(2);
        }
        if entries.is_empty() {
            break;
        }
        let l = ctx.eval(&entries).unwrap().to_vec();
        assert_eq!(l.len(), who.len() * nv);
        for (j, &i) in who.iter().enumerate() {
            let t = samplers[i].sample(&l[j * nv..(j + 1) * nv]);
            got[i].push(t);
            last[i] = Some(t);
        }
    }
    assert_eq!(got, alone);
    assert_eq!(ctx.n_past(1), 0);
    assert_eq!(ctx.n_past(0), prompts[0].len() + n - 1);

    // truncating a sequence to a prefix and feeding the rest again gives the same logits
    let k = prompts[1].len();
    ctx.truncate(seqs[1], k - 1);
    let again = ctx
        .eval(&[SeqTokens {
            seq: seqs[1],
            tokens: &prompts[1][k - 1..],
            logits: true,
        }])
        .unwrap()
        .to_vec();
    let mut s = Sampler::new(SamplerParams {
        temp: 0.0,
        ..Default::default()
    });
    assert_eq!(s.sample(&again), alone[1][0]);

    // errors name the problem
    let e = ctx
        .eval(&[
            SeqTokens {
                seq: 0,
                tokens: &[1],
                logits: true,
            },
            SeqTokens {
                seq: 0,
                tokens: &[1],
                logits: true,
            },
        ])
        .unwrap_err()
        .to_string();
    assert!(e.contains("twice"), "{e}");
    let e = ctx
        .eval(&[SeqTokens {
            seq: 9,
            tokens: &[1],
            logits: true,
        }])
        .unwrap_err()
        .to_string();
    assert!(e.contains("sequence 9"), "{e}");
}
