//! Field codecs shared by every exchange: strings, signatures, and [`Reader`], the
//! bounds-checked cursor every decoder reads through.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{SourceSig, WireError};

pub(super) fn put_str(b: &mut BytesMut, s: &str) {
    b.put_u32(s.len() as u32);
    b.put_slice(s.as_bytes());
}

pub(super) fn put_sig(b: &mut BytesMut, sig: Option<&SourceSig>) {
    if let Some(s) = sig {
        b.put_slice(&s.key);
        b.put_slice(&s.sig);
    }
}

/// `has_sig:u8 | [key:32 | sig:64]`
pub(super) fn put_opt_sig(b: &mut BytesMut, sig: Option<&SourceSig>) {
    b.put_u8(sig.is_some() as u8);
    put_sig(b, sig);
}

/// A bounds-checked cursor over a frame body.
pub(super) struct Reader {
    pub(super) b: Bytes,
    pub(super) what: &'static str,
}

impl Reader {
    pub(super) fn need(&self, n: usize) -> Result<(), WireError> {
        if self.b.remaining() < n {
            Err(WireError::Truncated(self.what))
        } else {
            Ok(())
        }
    }
    pub(super) fn u8(&mut self) -> Result<u8, WireError> {
        self.need(1)?;
        Ok(self.b.get_u8())
    }
    pub(super) fn u16(&mut self) -> Result<u16, WireError> {
        self.need(2)?;
        Ok(self.b.get_u16())
    }
    pub(super) fn u32(&mut self) -> Result<u32, WireError> {
        self.need(4)?;
        Ok(self.b.get_u32())
    }
    pub(super) fn u64(&mut self) -> Result<u64, WireError> {
        self.need(8)?;
        Ok(self.b.get_u64())
    }
    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        self.need(N)?;
        let mut a = [0u8; N];
        self.b.copy_to_slice(&mut a);
        Ok(a)
    }
    pub(super) fn string(&mut self) -> Result<String, WireError> {
        let n = self.u32()? as usize;
        self.need(n)?;
        let bytes = self.b.split_to(n);
        String::from_utf8(bytes.to_vec()).map_err(|_| WireError::BadUtf8(self.what))
    }
    /// A list count, checked against the bytes left so a forged count cannot drive allocation.
    pub(super) fn count(&mut self, min_item: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.b.remaining() {
            return Err(WireError::Truncated(self.what));
        }
        Ok(n)
    }

    pub(super) fn sig(&mut self) -> Result<SourceSig, WireError> {
        Ok(SourceSig {
            key: self.array()?,
            sig: self.array()?,
        })
    }

    pub(super) fn opt_sig(&mut self) -> Result<Option<Box<SourceSig>>, WireError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(Box::new(self.sig()?))),
            _ => Err(WireError::BadValue(self.what, "bad signature flag")),
        }
    }
}
