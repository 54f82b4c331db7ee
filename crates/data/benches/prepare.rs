//! Throughput of `prepare()` (read + tokenise + write) on the bundled State-of-the-Union corpus,
//! in bytes of document text per second.
//!
//! `cargo bench -p data --bench prepare -- --warm-up-time 1 --measurement-time 10 --sample-size 10`

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use data::PrepareOptions;

fn bench_prepare(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let corpus = root.join("data/corpus/sotu.jsonl.zst");
    let text_bytes: u64 = data::read_documents(&corpus)
        .expect("bundled corpus")
        .map(|d| d.expect("bundled corpus line").len() as u64)
        .sum();
    let dir = tempfile::tempdir().expect("temp dir");
    let opts = PrepareOptions {
        inputs: vec![corpus],
        output: dir.path().join("sotu"),
        tokenizer: root.join("data/gpt2"),
        eod_token: None,
        text_column: data::TEXT_COLUMN.into(),
        valid_fraction: 0.05,
        progress: false,
    };
    let mut group = c.benchmark_group("prepare");
    group.throughput(Throughput::Bytes(text_bytes));
    group.sample_size(10);
    group.bench_function("sotu", |b| {
        b.iter(|| data::prepare(&opts).expect("prepare"))
    });
    group.finish();
}

criterion_group!(benches, bench_prepare);
criterion_main!(benches);
