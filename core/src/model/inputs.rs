//! Model inputs: token ids with their positions and a validity mask, and for packed rows the
//! document of each token.
//!
//! Padding may sit on either side. Positions count real tokens only (`cumsum(valid) - 1`, clamped
//! at 0), as `transformers.generate` derives them from the attention mask, so a left-padded row
//! sees exactly the positions it would see alone. A packed row (padding-free training: several
//! documents concatenated, TRL's `padding_free`) restarts the positions at each document, and
//! attention never crosses documents, so each document sees what it would see alone.

use burn::tensor::{Bool, Int, Tensor, TensorData, backend::Backend};

use crate::error::{Error, Result};

/// A `[batch, seq]` block of tokens ready for [`crate::model::Qwen2::forward`].
#[derive(Debug, Clone)]
pub struct Inputs<B: Backend> {
    pub ids: Tensor<B, 2, Int>,
    pub positions: Tensor<B, 2, Int>,
    /// True where the token is real (not padding).
    pub valid: Tensor<B, 2, Bool>,
    /// Packed rows: each token's document within its row (0, 1, …); attention stays within a
    /// document. `None`: one sequence per row. Not for decoding from a KV cache.
    pub documents: Option<Tensor<B, 2, Int>>,
}

/// Host-side `[batch, seq]` token block, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBatch {
    pub batch: usize,
    pub seq: usize,
    pub ids: Vec<u32>,
    pub valid: Vec<bool>,
    /// Packed rows: each token's document within its row (see [`Inputs::documents`]).
    pub documents: Option<Vec<u32>>,
}

impl HostBatch {
    /// Left-pads `rows` with `pad_id` to the longest row (prompts for generation).
    pub fn left_padded(rows: &[Vec<u32>], pad_id: u32) -> Result<Self> {
        Self::padded(rows, pad_id, true)
    }

    /// Right-pads `rows` with `pad_id` to the longest row (training sequences).
    pub fn right_padded(rows: &[Vec<u32>], pad_id: u32) -> Result<Self> {
        Self::padded(rows, pad_id, false)
    }

    fn padded(rows: &[Vec<u32>], pad_id: u32, left: bool) -> Result<Self> {
        if rows.is_empty() {
            return Err(Error::InvalidInput("empty batch".into()));
        }
        if let Some(i) = rows.iter().position(|r| r.is_empty()) {
            return Err(Error::InvalidInput(format!("sequence {i} of the batch is empty")));
        }
        let seq = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(rows.len() * seq);
        let mut valid = Vec::with_capacity(rows.len() * seq);
        for row in rows {
            let pad = seq - row.len();
            let (before, after) = if left { (pad, 0) } else { (0, pad) };
            ids.extend(std::iter::repeat_n(pad_id, before).chain(row.iter().copied()));
            ids.extend(std::iter::repeat_n(pad_id, after));
            valid.extend(std::iter::repeat_n(false, before));
            valid.extend(std::iter::repeat_n(true, row.len()));
            valid.extend(std::iter::repeat_n(false, after));
        }
        Ok(Self { batch: rows.len(), seq, ids, valid, documents: None })
    }

    /// Packs the documents of each of `rows` into one row (concatenated, in order), right-padded
    /// with `pad_id` to the longest row: padding-free batches. With at most one document per row
    /// this is [`HostBatch::right_padded`] (no document labels).
    pub fn packed(rows: &[Vec<&[u32]>], pad_id: u32) -> Result<Self> {
        let joined: Vec<Vec<u32>> = rows.iter().map(|docs| docs.concat()).collect();
        let mut batch = Self::right_padded(&joined, pad_id)?;
        if let Some(i) = rows.iter().position(|docs| docs.iter().any(|d| d.is_empty())) {
            return Err(Error::InvalidInput(format!("row {i} of the packed batch holds an empty document")));
        }
        if rows.iter().all(|docs| docs.len() <= 1) {
            return Ok(batch);
        }
        let mut documents = Vec::with_capacity(batch.ids.len());
        for docs in rows {
            let mut row: Vec<u32> = docs.iter().enumerate().flat_map(|(i, d)| std::iter::repeat_n(i as u32, d.len())).collect();
            let last = row.last().copied().unwrap_or(0);
            row.resize(batch.seq, last);
            documents.extend(row);
        }
        batch.documents = Some(documents);
        Ok(batch)
    }

    /// Positions per row: `cumsum(valid) - 1`, clamped at 0, restarting at each document of a
    /// packed row.
    pub fn positions(&self) -> Vec<i64> {
        let seq = self.seq.max(1);
        let mut positions = Vec::with_capacity(self.ids.len());
        for (r, row) in self.valid.chunks(seq).enumerate() {
            let mut seen = 0i64;
            for (t, &v) in row.iter().enumerate() {
                if let Some(docs) = &self.documents
                    && t > 0
                    && docs[r * seq + t] != docs[r * seq + t - 1]
                {
                    seen = 0;
                }
                seen += v as i64;
                positions.push((seen - 1).max(0));
            }
        }
        positions
    }

    /// Uploads the block to `device`.
    pub fn to_device<B: Backend>(&self, device: &B::Device) -> Inputs<B> {
        let shape = [self.batch, self.seq];
        let ids: Vec<i64> = self.ids.iter().map(|&i| i as i64).collect();
        Inputs {
            ids: Tensor::from_data(TensorData::new(ids, shape), device),
            positions: Tensor::from_data(TensorData::new(self.positions(), shape), device),
            valid: Tensor::from_data(TensorData::new(self.valid.clone(), shape), device),
            documents: self.documents.as_ref().map(|docs| {
                let docs: Vec<i64> = docs.iter().map(|&d| d as i64).collect();
                Tensor::from_data(TensorData::new(docs, shape), device)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_padding_keeps_real_positions() {
        let b = HostBatch::left_padded(&[vec![5, 6, 7], vec![8]], 1).unwrap();
        assert_eq!(b.ids, vec![5, 6, 7, 1, 1, 8]);
        assert_eq!(b.valid, vec![true, true, true, false, false, true]);
        assert_eq!(b.positions(), vec![0, 1, 2, 0, 0, 0]);
        let r = HostBatch::right_padded(&[vec![5], vec![8, 9]], 0).unwrap();
        assert_eq!(r.ids, vec![5, 0, 8, 9]);
        assert_eq!(r.positions(), vec![0, 0, 0, 1]);
        assert!(HostBatch::left_padded(&[vec![1], vec![]], 0).is_err());
    }

    #[test]
    fn packed_rows_restart_positions_per_document() {
        let b = HostBatch::packed(&[vec![&[5, 6, 7][..], &[8, 9]], vec![&[3][..]]], 0).unwrap();
        assert_eq!((b.batch, b.seq), (2, 5));
        assert_eq!(b.ids, vec![5, 6, 7, 8, 9, 3, 0, 0, 0, 0]);
        assert_eq!(b.documents.as_deref(), Some(&[0, 0, 0, 1, 1, 0, 0, 0, 0, 0][..]));
        assert_eq!(b.positions(), vec![0, 1, 2, 0, 1, 0, 0, 0, 0, 0]);
        assert!(HostBatch::packed(&[vec![&[1][..], &[]]], 0).is_err());
        let single = HostBatch::packed(&[vec![&[5, 6][..]], vec![&[3][..]]], 0).unwrap();
        assert_eq!((single.ids, single.documents), (vec![5, 6, 3, 0], None));
    }
}
