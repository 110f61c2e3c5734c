//! torch's tensor record read straight from `data.pkl` ([`ckpt_pickle::build::Builder::construct`]): the
//! thirty-odd opcodes `torch.save` writes for each tensor after the first, turned into the tensor without
//! the pickle VM's dispatch and intermediate values. On a state dict of 20,000 small tensors that is most
//! of what decoding `data.pkl` costs.
//!
//! What is read, as protocol 2 writes it once `_rebuild_tensor_v2`, `'storage'`, the storage class and
//! `OrderedDict` are memoized (BINGET stands for BINGET or LONG_BINGET, BINPUT for BINPUT or LONG_BINPUT,
//! an int for BININT1, BININT2, BININT or a LONG1 of at most 8 bytes, a string for BINUNICODE or
//! SHORT_BINUNICODE):
//!
//! ```text
//! BINGET _rebuild_tensor_v2  MARK  MARK
//!   BINGET 'storage'  BINGET <storage class>  <key: string [BINPUT] or BINGET>  <location: same>  <numel: int>
//!   TUPLE [BINPUT]  BINPERSID
//!   <offset: int>  <size>  <stride>  NEWTRUE|NEWFALSE
//!   BINGET OrderedDict  EMPTY_TUPLE  REDUCE [BINPUT]
//! TUPLE [BINPUT]  REDUCE
//! ```
//!
//! where a size or stride is EMPTY_TUPLE, one to three ints and TUPLE1 to TUPLE3, or MARK, ints and TUPLE,
//! each but the empty one followed by an optional BINPUT. Anything else (the first tensor, whose globals and
//! strings are new; a 7th argument with metadata; other rebuild functions) is left to the VM, and so are the
//! calls around a record (a parameter's `_rebuild_parameter`, whose tensor record is read here).
//! The tensor is made by the rules of `TorchBuilder::persistent_id` and `TorchBuilder::dense_tensor`,
//! from the same arguments, so it is the one the VM's calls would have made.

use std::borrow::Cow;

use ckpt_pickle::build::{Construct, Memo, Tally};
use ckpt_pickle::opcode as op;

use super::{Dims, Known, T, TorchBuilder};

/// A position in the pickle.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    fn byte(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn expect(&mut self, code: u8) -> Option<()> {
        (self.byte()? == code).then_some(())
    }

    fn le(&mut self, n: usize) -> Option<u64> {
        let v = op::le_at(self.data, self.pos, n)?;
        self.pos += n;
        Some(v)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.data.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
}

/// The value a GET copies onto the stack.
fn get<'m, 'a>(c: &mut Cursor<'a>, t: &mut Tally, memo: &'m Memo<'_, T<'a>>) -> Option<&'m T<'a>> {
    let key = match c.byte()? {
        op::BINGET => c.le(1)?,
        op::LONG_BINGET => c.le(4)?,
        _ => return None,
    };
    t.get(memo, key)
}

/// An optional BINPUT of the value just read.
fn put(c: &mut Cursor<'_>, t: &mut Tally) -> Option<()> {
    let n = match c.peek() {
        Some(op::BINPUT) => 1,
        Some(op::LONG_BINPUT) => 4,
        _ => return Some(()),
    };
    c.pos += 1;
    let key = c.le(n)?;
    t.put(key)
}

/// A string written here (and optionally memoized) or copied from the memo.
fn text<'a>(c: &mut Cursor<'a>, t: &mut Tally, memo: &Memo<'_, T<'a>>) -> Option<Cow<'a, str>> {
    let n = match c.peek()? {
        op::BINUNICODE => {
            c.pos += 1;
            usize::try_from(c.le(4)?).ok()?
        }
        op::SHORT_BINUNICODE => {
            c.pos += 1;
            usize::try_from(c.le(1)?).ok()?
        }
        _ => {
            return match get(c, t, memo)? {
                T::Str(s) => Some(s.clone()),
                _ => None,
            };
        }
    };
    let s = std::str::from_utf8(c.take(n)?).ok()?;
    t.string(n)?;
    put(c, t)?;
    Some(Cow::Borrowed(s))
}

/// An int that fits `i64`, as the VM reads it.
fn int(c: &mut Cursor<'_>, t: &mut Tally) -> Option<i64> {
    let v = match c.byte()? {
        op::BININT1 => i64::try_from(c.le(1)?).ok()?,
        op::BININT2 => i64::try_from(c.le(2)?).ok()?,
        op::BININT => i64::from(i32::from_le_bytes(u32::try_from(c.le(4)?).ok()?.to_le_bytes())),
        op::LONG1 => {
            // Little-endian two's complement of n <= 8 bytes.
            let n = usize::from(c.byte()?);
            if n > 8 {
                return None;
            }
            if n == 0 {
                0
            } else {
                let raw = c.le(n)?;
                let unused = 64 - 8 * n as u32;
                ((raw << unused) as i64) >> unused
            }
        }
        _ => return None,
    };
    t.scalar()?;
    Some(v)
}

fn is_int(code: u8) -> bool {
    matches!(code, op::BININT1 | op::BININT2 | op::BININT | op::LONG1)
}

/// A size or stride tuple of non-negative ints.
fn dims(c: &mut Cursor<'_>, t: &mut Tally) -> Option<Dims> {
    let mut d = Dims { inline: [0; Dims::INLINE], len: 0, more: Vec::new() };
    let mut add = |v: i64| -> Option<()> {
        let v = usize::try_from(v).ok()?;
        match d.inline.get_mut(d.len) {
            Some(slot) if d.more.is_empty() => *slot = v,
            _ => {
                if d.more.is_empty() {
                    d.more.extend_from_slice(&d.inline);
                }
                d.more.push(v);
            }
        }
        d.len += 1;
        Some(())
    };
    match c.peek()? {
        op::EMPTY_TUPLE => {
            c.pos += 1;
            t.tuple_n(0)?;
            return Some(d);
        }
        op::MARK => {
            c.pos += 1;
            t.mark()?;
            while is_int(c.peek()?) {
                add(int(c, t)?)?;
            }
            c.expect(op::TUPLE)?;
            t.tuple()?;
        }
        _ => {
            let mut n = 0;
            while n < 3 && is_int(c.peek()?) {
                add(int(c, t)?)?;
                n += 1;
            }
            let code = c.byte()?;
            if n == 0 || usize::from(code.wrapping_sub(op::TUPLE1)) + 1 != n {
                return None;
            }
            t.tuple_n(n)?;
        }
    }
    put(c, t)?;
    Some(d)
}

/// `_rebuild_tensor_v2`'s record at `at` (see the module docs), or `None` for the VM to run.
pub(super) fn tensor_v2<'a>(
    b: &mut TorchBuilder<'_>,
    data: &'a [u8],
    at: usize,
    memo: &Memo<'_, T<'a>>,
) -> Option<Construct<T<'a>>> {
    let known = |b: &TorchBuilder<'_>, v: &T<'_>| b.global_of(v).map(|g| g.known);
    // Most GETs of a pickle are not a tensor record's: looked at before anything is set up.
    let callable = match *data.get(at)? {
        op::BINGET => op::le_at(data, at + 1, 1)?,
        op::LONG_BINGET => op::le_at(data, at + 1, 4)?,
        _ => return None,
    };
    if known(b, memo.leaf_value(callable)?) != Some(Known::RebuildTensorV2) {
        return None;
    }
    let mut c = Cursor { data, pos: at };
    let mut t = Tally::new();
    get(&mut c, &mut t, memo)?;
    c.expect(op::MARK)?;
    t.mark()?;
    c.expect(op::MARK)?;
    t.mark()?;
    // The persistent id ('storage', class, key, location, numel).
    if text(&mut c, &mut t, memo)? != "storage" {
        return None;
    }
    let dtype = b.global_of(get(&mut c, &mut t, memo)?).and_then(|g| g.storage)?;
    let key = text(&mut c, &mut t, memo)?;
    text(&mut c, &mut t, memo)?;
    let numel = int(&mut c, &mut t)?;
    c.expect(op::TUPLE)?;
    t.tuple()?;
    put(&mut c, &mut t)?;
    c.expect(op::BINPERSID)?;
    t.persistent_id()?;
    // offset, size, stride, requires_grad, backward hooks: OrderedDict().
    let offset = usize::try_from(int(&mut c, &mut t)?).ok()?;
    let size = dims(&mut c, &mut t)?;
    let stride = dims(&mut c, &mut t)?;
    let requires_grad = match c.byte()? {
        op::NEWTRUE => true,
        op::NEWFALSE => false,
        _ => return None,
    };
    t.scalar()?;
    if known(b, get(&mut c, &mut t, memo)?) != Some(Known::OrderedDict) {
        return None;
    }
    c.expect(op::EMPTY_TUPLE)?;
    t.tuple_n(0)?;
    c.expect(op::REDUCE)?;
    t.reduce()?;
    put(&mut c, &mut t)?;
    c.expect(op::TUPLE)?;
    t.tuple()?;
    put(&mut c, &mut t)?;
    c.expect(op::REDUCE)?;
    t.reduce()?;
    // What persistent_id and dense_tensor make of these arguments.
    let storage = b.storages.storage(dtype, &key, numel)?;
    let tensor =
        super::tensor_value(dtype, size.as_slice(), stride.as_slice(), offset, storage, (false, false), requires_grad)
            .ok()?;
    Some(Construct { value: T::V(Box::new(tensor)), end: c.pos, tally: t })
}
