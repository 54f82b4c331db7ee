//! A resume reads the inputs the run was trained on (issue 24): the data's and the tokenizer's
//! fingerprints in the manifest, the metrics file's damaged lines reported, and prepare-data's
//! memory bounded on documents without whitespace.
