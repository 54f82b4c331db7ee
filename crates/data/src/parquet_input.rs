//! Streaming reader for Parquet files (FineWeb's layout: one row per document, the text in a
//! string column, `text` by default; other columns are not read).
//!
//! The file is read row group by row group: only the text column's pages of one row group are
//! decoded at a time, and only that row group's texts are held in memory, so a file of many GB
//! streams. Snappy- and zstd-compressed pages are supported (and uncompressed ones). A null
//! value is an empty document. Row numbers in errors count from 1 over the whole file.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use parquet::column::reader::ColumnReader;
use parquet::errors::ParquetError;
use parquet::file::reader::{FileReader, RowGroupReader};
use parquet::file::serialized_reader::SerializedFileReader;

use crate::documents::count;
use crate::error::{DataError, Result};

/// Records decoded per call of the column reader.
const READ_RECORDS: usize = 1024;

/// The documents of one Parquet file.
pub(crate) struct ParquetDocuments {
    path: PathBuf,
    column_name: String,
    reader: SerializedFileReader<File>,
    /// Index of the text column among the leaf columns.
    column: usize,
    max_def_level: i16,
    next_group: usize,
    /// The current row group's texts not yet yielded.
    texts: std::vec::IntoIter<String>,
    /// Rows read so far (for error messages).
    rows: u64,
    counter: Option<Arc<AtomicU64>>,
    done: bool,
}

impl ParquetDocuments {
    /// Opens `path` and checks that it has a top-level string column `column`.
    pub(crate) fn open(path: &Path, column: &str, counter: Option<Arc<AtomicU64>>) -> Result<Self> {
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let reader = SerializedFileReader::new(file).map_err(|e| parquet_error(path, e))?;
        let schema = reader.metadata().file_metadata().schema_descr_ptr();
        let not_string = |found: String| DataError::NotStringColumn {
            path: path.to_path_buf(),
            column: column.to_string(),
            found,
        };
        let Some(index) = schema
            .columns()
            .iter()
            .position(|c| c.path().parts() == [column])
        else {
            let fields = schema.root_schema().get_fields();
            if fields.iter().any(|f| f.name() == column) {
                return Err(not_string("a nested (group or list) column".into()));
            }
            return Err(DataError::MissingColumn {
                path: path.to_path_buf(),
                column: column.to_string(),
                columns: fields.iter().map(|f| f.name().to_string()).collect(),
            });
        };
        let desc = schema.column(index);
        let is_string = matches!(desc.logical_type_ref(), Some(LogicalType::String))
            || desc.converted_type() == ConvertedType::UTF8;
        if desc.physical_type() != PhysicalType::BYTE_ARRAY || !is_string {
            let found = match desc.logical_type_ref() {
                Some(logical) => format!("{:?} ({logical:?})", desc.physical_type()),
                None => format!("{:?}", desc.physical_type()),
            };
            return Err(not_string(found));
        }
        if desc.max_rep_level() > 0 {
            return Err(not_string("a repeated column".into()));
        }
        Ok(ParquetDocuments {
            path: path.to_path_buf(),
            column_name: column.to_string(),
            max_def_level: desc.max_def_level(),
            reader,
            column: index,
            next_group: 0,
            texts: Vec::new().into_iter(),
            rows: 0,
            counter,
            done: false,
        })
    }

    /// Decodes the next row group with any rows into `self.texts`; `false` at the file's end.
    fn next_row_group(&mut self) -> Result<bool> {
        while self.next_group < self.reader.num_row_groups() {
            let group = self
                .reader
                .get_row_group(self.next_group)
                .map_err(|e| parquet_error(&self.path, e))?;
            self.next_group += 1;
            let texts = self.read_texts(group.as_ref())?;
            count(
                &self.counter,
                group.metadata().compressed_size().max(0) as u64,
            );
            if !texts.is_empty() {
                self.texts = texts.into_iter();
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The text column of one row group, a string a row.
    fn read_texts(&self, group: &dyn RowGroupReader) -> Result<Vec<String>> {
        let rows = group.metadata().num_rows().max(0) as usize;
        let mut reader = match group
            .get_column_reader(self.column)
            .map_err(|e| parquet_error(&self.path, e))?
        {
            ColumnReader::ByteArrayColumnReader(r) => r,
            _ => {
                return Err(DataError::NotStringColumn {
                    path: self.path.clone(),
                    column: self.column_name.clone(),
                    found: "not BYTE_ARRAY in a row group".into(),
                })
            }
        };
        let mut texts = Vec::with_capacity(rows.min(1 << 20));
        let (mut defs, mut values) = (Vec::new(), Vec::new());
        loop {
            defs.clear();
            values.clear();
            let (records, _, _) = reader
                .read_records(READ_RECORDS, Some(&mut defs), None, &mut values)
                .map_err(|e| parquet_error(&self.path, e))?;
            if records == 0 {
                break;
            }
            let mut values = values.drain(..);
            for i in 0..records {
                let present = self.max_def_level == 0 || defs.get(i) == Some(&self.max_def_level);
                let row = self.rows + texts.len() as u64 + 1;
                let text = match present.then(|| values.next()).flatten() {
                    Some(v) => {
                        String::from_utf8(v.data().to_vec()).map_err(|_| DataError::NotUtf8 {
                            path: self.path.clone(),
                            column: self.column_name.clone(),
                            row,
                        })?
                    }
                    None => String::new(),
                };
                texts.push(text);
            }
        }
        Ok(texts)
    }
}

impl Iterator for ParquetDocuments {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        if self.done {
            return None;
        }
        if let Some(text) = self.texts.next() {
            self.rows += 1;
            return Some(Ok(text));
        }
        match self.next_row_group() {
            Ok(true) => {
                self.rows += 1;
                self.texts.next().map(Ok)
            }
            Ok(false) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

fn parquet_error(path: &Path, source: ParquetError) -> DataError {
    DataError::Parquet {
        path: path.to_path_buf(),
        source,
    }
}
