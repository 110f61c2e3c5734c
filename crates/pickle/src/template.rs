//! Templates: shapes of pickled objects that a builder expects many times (torch's tensor record, a dataclass
//! of a few fields), which a [`Builder`](crate::Builder) declares, and what a template captured, which it makes
//! the object from. The machine reads them (`machine::template`).

/// A shape of pickled value, for a [`Template`].
///
/// Each variant reads one value, in the forms CPython's pickler writes it (protocols 2 to 5); a value made
/// by the pickle may be memoized right after it (PUT, BINPUT, LONG_BINPUT, MEMOIZE) under a key that no GET
/// reads. Leaves that vary are *captured*, in the order they are read (see [`Captures`]).
#[derive(Debug, Clone, Copy)]
pub enum Pattern {
    /// A GET of this global (memoized earlier in the pickle). Not captured.
    Global(&'static str, &'static str),
    /// A GET of any global: captured as [`Capture::Global`].
    AnyGlobal,
    /// A `str` written here (SHORT_BINUNICODE, BINUNICODE) or a GET of one: captured as [`Capture::Str`].
    Str,
    /// A `str` equal to this (written here or a GET). Not captured.
    StrEq(&'static str),
    /// An int that fits `i64` (BININT1, BININT2, BININT, LONG1): captured as [`Capture::Int`].
    Int,
    /// NEWTRUE or NEWFALSE: captured as [`Capture::Bool`].
    Bool,
    /// NONE: captured as [`Capture::None`].
    None,
    /// A tuple of up to 8 ints made here (EMPTY_TUPLE, TUPLE1-3, MARK ... TUPLE): captured as
    /// [`Capture::Ints`].
    Ints,
    /// A tuple of these values (TUPLE1-3 or MARK ... TUPLE; EMPTY_TUPLE for none).
    Tuple(&'static [Pattern]),
    /// BINPERSID of this value.
    PersistentId(&'static Pattern),
    /// REDUCE: this callable with these arguments.
    Reduce(&'static Pattern, &'static Pattern),
    /// An object pickled the way CPython pickles a dataclass or plain class instance: the class,
    /// EMPTY_TUPLE, NEWOBJ, then an EMPTY_DICT filled with these fields (SETITEM for one, MARK ... SETITEMS
    /// for more; in any order, each at most once, none other) and BUILD. Captures each field's value in the
    /// order the fields are declared, [`Capture::Absent`] for a field the state does not have.
    Object {
        /// The class (normally [`Pattern::Global`]).
        class: &'static Pattern,
        /// Field names and what each holds.
        fields: &'static [(&'static str, Pattern)],
    },
    /// The first of these alternatives that reads: captured as [`Capture::Choice`] (its index), then the
    /// alternative's own captures.
    Choice(&'static [Pattern]),
    /// A GET of any memoized value: captured as [`Capture::Value`], the builder's own reference to it
    /// ([`Builder::share`](crate::Builder::share)).
    Memo,
}

/// A fast path a [`Builder`](crate::Builder) declares ([`Builder::templates`](crate::Builder::templates)): a [`Pattern::Reduce`] or
/// [`Pattern::Object`] whose callable or class is a [`Pattern::Global`], read at each GET of that global.
#[derive(Debug, Clone, Copy)]
pub struct Template {
    /// What the object looks like.
    pub pattern: Pattern,
}

impl Template {
    /// The global whose GET starts this template.
    pub(crate) fn global(&self) -> Option<(&'static str, &'static str)> {
        match self.pattern {
            Pattern::Reduce(Pattern::Global(m, n), _) | Pattern::Object { class: Pattern::Global(m, n), .. } => {
                Some((m, n))
            }
            _ => None,
        }
    }
}

/// Up to 8 ints of a tuple read by [`Pattern::Ints`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ints {
    pub(crate) len: u8,
    pub(crate) items: [i64; 8],
}

impl Ints {
    /// The ints.
    #[must_use]
    pub fn as_slice(&self) -> &[i64] {
        self.items.get(..usize::from(self.len)).unwrap_or_default()
    }

    pub(crate) fn push(&mut self, v: i64) -> Option<()> {
        *self.items.get_mut(usize::from(self.len))? = v;
        self.len += 1;
        Some(())
    }
}

/// One value a [`Pattern`] captured.
#[derive(Debug)]
pub enum Capture<'a, V> {
    /// [`Pattern::None`].
    None,
    /// [`Pattern::Bool`].
    Bool(bool),
    /// [`Pattern::Int`].
    Int(i64),
    /// [`Pattern::Str`], borrowed from the input.
    Str(&'a str),
    /// [`Pattern::AnyGlobal`]: module and name as written.
    Global(&'a str, &'a str),
    /// [`Pattern::Ints`].
    Ints(Ints),
    /// [`Pattern::Memo`]: the builder's reference to the memoized value.
    Value(V),
    /// [`Pattern::Choice`]: which alternative read.
    Choice(usize),
    /// A field of a [`Pattern::Object`] that the object's state does not have.
    Absent,
    /// Taken already.
    Taken,
}

/// One value a template captured, as the reader keeps it (small: ints and shared values live beside it).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cap<'a> {
    None,
    Bool(bool),
    Int(i64),
    Str(&'a str),
    /// Index into the machine's globals.
    Global(u32),
    /// Index into [`Tally::ints`].
    Ints(u8),
    Choice(u32),
    Absent,
    /// While reading: the shared object's id; handed to the builder: the index of its reference in
    /// [`Captures::values`].
    Shared(u32),
    Taken,
}

/// What a template captured, in order, for [`Builder::template`](crate::Builder::template).
#[derive(Debug)]
pub struct Captures<'a, 'c, V> {
    pub(crate) caps: &'c [Cap<'a>],
    pub(crate) ints: &'c [Ints],
    pub(crate) globals: &'c [(&'a str, &'a str)],
    /// The builder's references to the memoized values captured ([`Capture::Value`]).
    pub(crate) values: &'c mut [Option<V>],
    pub(crate) next: usize,
}

impl<'a, V> Captures<'a, '_, V> {
    /// The next capture (`None` after the last).
    pub fn next_capture(&mut self) -> Option<Capture<'a, V>> {
        let c = self.next_cap()?;
        Some(match c {
            Cap::None => Capture::None,
            Cap::Bool(v) => Capture::Bool(v),
            Cap::Int(v) => Capture::Int(v),
            Cap::Str(v) => Capture::Str(v),
            Cap::Global(i) => self.globals.get(i as usize).map_or(Capture::Taken, |&(m, n)| Capture::Global(m, n)),
            Cap::Ints(i) => self.ints.get(usize::from(i)).map_or(Capture::Taken, |&v| Capture::Ints(v)),
            Cap::Choice(i) => Capture::Choice(i as usize),
            Cap::Absent => Capture::Absent,
            Cap::Shared(i) => {
                self.values.get_mut(i as usize).and_then(Option::take).map_or(Capture::Taken, Capture::Value)
            }
            Cap::Taken => Capture::Taken,
        })
    }

    /// The next capture as the reader keeps it.
    fn next_cap(&mut self) -> Option<Cap<'a>> {
        let c = *self.caps.get(self.next)?;
        self.next += 1;
        Some(c)
    }

    /// The next capture as an int.
    pub fn int(&mut self) -> Option<i64> {
        match self.next_cap()? {
            Cap::Int(v) => Some(v),
            _ => None,
        }
    }

    /// The next capture as a bool.
    pub fn bool(&mut self) -> Option<bool> {
        match self.next_cap()? {
            Cap::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The next capture as a string.
    pub fn str(&mut self) -> Option<&'a str> {
        match self.next_cap()? {
            Cap::Str(v) => Some(v),
            _ => None,
        }
    }

    /// The next capture as a global's module and name.
    pub fn global(&mut self) -> Option<(&'a str, &'a str)> {
        match self.next_cap()? {
            Cap::Global(i) => self.globals.get(i as usize).copied(),
            _ => None,
        }
    }

    /// The next capture as a tuple of ints.
    pub fn ints(&mut self) -> Option<Ints> {
        match self.next_cap()? {
            Cap::Ints(i) => self.ints.get(usize::from(i)).copied(),
            _ => None,
        }
    }

    /// The next capture as the index of a [`Pattern::Choice`]'s alternative.
    pub fn choice(&mut self) -> Option<usize> {
        match self.next_cap()? {
            Cap::Choice(v) => Some(v as usize),
            _ => None,
        }
    }

    /// Whether the next capture is [`Capture::Absent`] (which it then takes).
    pub fn absent(&mut self) -> bool {
        if matches!(self.caps.get(self.next), Some(Cap::Absent)) {
            self.next += 1;
            return true;
        }
        false
    }

    /// The next capture as a memoized value.
    pub fn value(&mut self) -> Option<V> {
        match self.next_capture()? {
            Capture::Value(v) => Some(v),
            _ => None,
        }
    }
}
