//! Megatron `.bin`/`.idx`: round trip, the exact header bytes, and every validation error.

use std::path::{Path, PathBuf};

use data::{DataError, IndexedDataset, IndexedDatasetWriter, TokenDType};

fn write(prefix: &Path, vocab: usize, docs: &[&[u32]]) -> data::IndexStats {
    let mut w = IndexedDatasetWriter::create(prefix, vocab).unwrap();
    for d in docs {
        w.add_document(d).unwrap();
    }
    w.finish().unwrap()
}

fn paths(prefix: &Path) -> (PathBuf, PathBuf) {
    let p = prefix.to_str().unwrap();
    (
        PathBuf::from(format!("{p}.bin")),
        PathBuf::from(format!("{p}.idx")),
    )
}

fn reason(err: DataError) -> (String, String) {
    match err {
        DataError::BadIndex { path, reason } => {
            ("idx".into(), format!("{} {reason}", path.display()))
        }
        DataError::BadBin { path, reason } => {
            ("bin".into(), format!("{} {reason}", path.display()))
        }
        other => panic!("expected BadIndex/BadBin, got {other:?}"),
    }
}

#[test]
fn round_trip_u16_and_i32() {
    let dir = tempfile::tempdir().unwrap();
    let docs: [&[u32]; 3] = [&[1, 2, 3, 50256], &[50256], &[7, 65000 % 50257, 50256]];
    for (vocab, dtype) in [(50257, TokenDType::U16), (100_000, TokenDType::I32)] {
        let prefix = dir.path().join(format!("ds.v{vocab}"));
        let stats = write(&prefix, vocab, &docs);
        assert_eq!((stats.documents, stats.tokens, stats.dtype), (3, 8, dtype));
        let ds = IndexedDataset::open(&prefix).unwrap();
        assert_eq!(ds.dtype(), dtype);
        assert_eq!(ds.num_documents(), 3);
        assert_eq!(ds.num_tokens(), 8);
        assert_eq!(ds.sizes(), [4, 1, 3]);
        assert_eq!(ds.document_lengths(), [4, 1, 3]);
        for (i, d) in docs.iter().enumerate() {
            assert_eq!(ds.document(i), *d);
        }
        assert_eq!(ds.tokens(), docs.concat());
        let (bin, _) = paths(&prefix);
        assert_eq!(
            std::fs::metadata(bin).unwrap().len(),
            8 * dtype.bytes() as u64
        );
    }
    // No temp files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn idx_bytes_match_megatron_layout() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("two");
    write(&prefix, 50257, &[&[15496, 995, 50256], &[50256]]);
    let mut expected: Vec<u8> = Vec::new();
    expected.extend_from_slice(b"MMIDIDX\x00\x00");
    expected.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]); // version 1
    expected.push(8); // uint16
    expected.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]); // 2 sequences
    expected.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]); // 3 doc_idx entries
    expected.extend_from_slice(&[3, 0, 0, 0, 1, 0, 0, 0]); // sizes i32 [3, 1]
    expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]); // pointer 0
    expected.extend_from_slice(&[6, 0, 0, 0, 0, 0, 0, 0]); // pointer 6 = 3 tokens * 2 bytes
    for d in 0u8..3 {
        expected.extend_from_slice(&[d, 0, 0, 0, 0, 0, 0, 0]); // doc_idx [0, 1, 2]
    }
    let (bin, idx) = paths(&prefix);
    assert_eq!(std::fs::read(idx).unwrap(), expected);
    // 15496 = 0x3c88, 995 = 0x03e3, 50256 = 0xc450, little-endian uint16
    assert_eq!(
        std::fs::read(bin).unwrap(),
        [0x88, 0x3c, 0xe3, 0x03, 0x50, 0xc4, 0x50, 0xc4]
    );
}

#[test]
fn empty_dataset_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("empty");
    write(&prefix, 50257, &[]);
    let ds = IndexedDataset::open(&prefix).unwrap();
    assert_eq!((ds.num_documents(), ds.num_tokens()), (0, 0));
    assert!(ds.tokens().is_empty());
}

#[test]
fn writer_rejects_out_of_vocab_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = IndexedDatasetWriter::create(&dir.path().join("x"), 100).unwrap();
    match w.add_document(&[1, 100]) {
        Err(DataError::TokenOutOfRange {
            id: 100,
            vocab_size: 100,
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn dropped_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("x");
    let mut w = IndexedDatasetWriter::create(&prefix, 100).unwrap();
    w.add_document(&[1, 2]).unwrap();
    drop(w);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Writes a 3-document dataset, lets `corrupt` edit the (idx, bin) bytes, opens it.
fn open_corrupted(corrupt: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>)) -> DataError {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("c");
    write(&prefix, 50257, &[&[1, 2, 3], &[4, 5], &[6]]);
    let (bin_path, idx_path) = paths(&prefix);
    let mut idx = std::fs::read(&idx_path).unwrap();
    let mut bin = std::fs::read(&bin_path).unwrap();
    corrupt(&mut idx, &mut bin);
    std::fs::write(&idx_path, idx).unwrap();
    std::fs::write(&bin_path, bin).unwrap();
    IndexedDataset::open(&prefix).unwrap_err()
}

const SIZES: usize = data::HEADER_LEN;
const POINTERS: usize = SIZES + 3 * 4;
const DOC_IDX: usize = POINTERS + 3 * 8;

#[test]
fn corrupt_magic() {
    let (kind, msg) = reason(open_corrupted(|idx, _| idx[0] = b'X'));
    assert_eq!(kind, "idx");
    assert!(msg.contains("c.idx") && msg.contains("bad magic"), "{msg}");
}

#[test]
fn bad_version_and_dtype() {
    let (_, msg) = reason(open_corrupted(|idx, _| idx[9] = 2));
    assert!(msg.contains("unsupported version 2"), "{msg}");
    let (_, msg) = reason(open_corrupted(|idx, _| idx[17] = 6));
    assert!(msg.contains("unsupported dtype code 6"), "{msg}");
}

#[test]
fn truncated_idx() {
    let (kind, msg) = reason(open_corrupted(|idx, _| idx.truncate(POINTERS + 4)));
    assert_eq!(kind, "idx");
    assert!(
        msg.contains("truncated: header says 3 sequences and 4 document indices"),
        "{msg}"
    );
    let (_, msg) = reason(open_corrupted(|idx, _| idx.truncate(20)));
    assert!(msg.contains("truncated") && msg.contains("header"), "{msg}");
    let (_, msg) = reason(open_corrupted(|idx, _| idx.push(0)));
    assert!(msg.contains("1 unexpected bytes"), "{msg}");
}

#[test]
fn truncated_bin() {
    let (kind, msg) = reason(open_corrupted(|_, bin| bin.truncate(7)));
    assert_eq!(kind, "bin");
    assert!(msg.contains("c.bin") && msg.contains("truncated"), "{msg}");
    assert!(
        msg.contains("6 uint16 tokens (12 bytes)") && msg.contains("holds 7 bytes"),
        "{msg}"
    );
}

#[test]
fn pointer_out_of_range() {
    let (kind, msg) = reason(open_corrupted(|idx, _| {
        idx[POINTERS + 16..POINTERS + 24].copy_from_slice(&1000i64.to_le_bytes())
    }));
    assert_eq!(kind, "idx");
    assert!(
        msg.contains("pointer out of range: sequence 2 starts at byte 1000"),
        "{msg}"
    );
}

#[test]
fn inconsistent_pointers_sizes_and_doc_idx() {
    let (_, msg) = reason(open_corrupted(|idx, _| {
        idx[POINTERS + 8..POINTERS + 16].copy_from_slice(&4i64.to_le_bytes())
    }));
    assert!(
        msg.contains("inconsistent pointers: sequence 1 starts at byte 4, expected 6"),
        "{msg}"
    );
    let (_, msg) = reason(open_corrupted(|idx, _| {
        idx[SIZES..SIZES + 4].copy_from_slice(&(-1i32).to_le_bytes())
    }));
    assert!(msg.contains("negative size"), "{msg}");
    let (_, msg) = reason(open_corrupted(|idx, _| {
        idx[DOC_IDX + 16..DOC_IDX + 24].copy_from_slice(&0i64.to_le_bytes())
    }));
    assert!(msg.contains("doc_idx is not monotone: entry 2"), "{msg}");
    let (_, msg) = reason(open_corrupted(|idx, _| {
        idx[DOC_IDX + 24..DOC_IDX + 32].copy_from_slice(&2i64.to_le_bytes())
    }));
    assert!(
        msg.contains("doc_idx ends at 2 but there are 3 sequences"),
        "{msg}"
    );
}

#[test]
fn missing_files_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let err = IndexedDataset::open(&dir.path().join("nope")).unwrap_err();
    assert!(err.to_string().contains("nope.idx"), "{err}");
    let prefix = dir.path().join("half");
    write(&prefix, 50257, &[&[1]]);
    std::fs::remove_file(paths(&prefix).0).unwrap();
    let err = IndexedDataset::open(&prefix).unwrap_err();
    assert!(err.to_string().contains("half.bin"), "{err}");
}
