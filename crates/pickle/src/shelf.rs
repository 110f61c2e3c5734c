//! Where a builder of trees keeps the objects a pickle shares, and how they are placed into the finished tree
//! once the pickle has stopped changing them.
//!
//! See [`Shelf`].

use crate::error::Error;

/// The objects a builder keeps aside because the pickle refers to them from several places.
///
/// A builder that makes trees (a [`Value`](crate::Value), a checkpoint's values) cannot hand out copies of an
/// object the pickle may still change. It moves such an object to its [`Shelf`] at its first
/// [`share`](crate::Builder::share) and hands out *handles* to it instead, which every later APPEND,
/// SETITEMS or BUILD reaches through. At the end, [`Shelf::splice`] puts the objects where the handles are:
///
/// - an object referred to once goes in place, even on a cycle (the cycle closes at another of its objects,
///   one referred to from inside it and from where the walk entered it);
/// - an object on a cycle referred to from several places, or a mutable one ([`Tree::is_mutable`]) referred
///   to from several places, becomes a shared definition at its first place in a depth-first walk and
///   references everywhere else, numbered in that order;
/// - any other object referred to from several places (a string, a tuple) is copied into each place.
///
/// Whether an object is shared depends only on the object graph, not on which objects a builder shelved: a
/// builder that shelves every object (the graph builder) and one that shelves only what the pickle fetches
/// from its memo (the value builder) make the same tree.
///
/// Everything here walks handles, not the trees around them, more than once; the trees themselves are
/// walked once to find their handles and once to place them.
#[derive(Debug, Clone)]
pub struct Shelf<V> {
    items: Vec<Option<V>>,
}

impl<V> Default for Shelf<V> {
    fn default() -> Self {
        Shelf { items: Vec::new() }
    }
}

/// How a builder's values are made, for [`Shelf::splice`]: implemented by a marker type of the builder's
/// (so a builder can describe a value type of another crate). Nothing here recurses: a value is taken apart
/// into its shape and children, and put together again.
pub trait Tree<V> {
    /// What a container is, without its children.
    type Shape;
    /// The shelf handle `v` stands for, if it is one.
    fn handle(v: &V) -> Option<u32>;
    /// Pushes the values directly inside `v` to `out`, in order.
    fn children<'v>(v: &'v V, out: &mut Vec<&'v V>);
    /// Takes a container apart into its shape and children (in [`Tree::children`]' order); a leaf comes back
    /// as `Err`.
    ///
    /// # Errors
    /// `v` itself, when it holds no values.
    fn split(v: V) -> Result<(Self::Shape, Vec<V>), V>;
    /// Puts a container together again from what [`Tree::split`] gave.
    fn join(shape: Self::Shape, children: Vec<V>) -> V;
    /// Whether a program can change `v` in place (a list, dict, set or object), so that every place that
    /// refers to it must keep referring to the one object.
    fn is_mutable(v: &V) -> bool;
    /// `v`, at the first place of an object other places refer to by `id`.
    fn shared(id: u32, v: V) -> V;
    /// A reference to the object shared under `id`.
    fn reference(id: u32) -> V;
    /// A copy of `v` (handles inside it copied as handles).
    fn copy(v: &V) -> V;
    /// A value to leave where one was taken out.
    fn placeholder() -> V;
}

/// What [`Shelf::splice`] does with each shelved object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Not reached from the root.
    Unreached,
    /// Moved to its one place.
    Inline,
    /// Defined at its first place, referred to elsewhere.
    Shared,
    /// Copied into each place.
    Copied,
}

impl<V> Shelf<V> {
    /// Keeps `v`; its handle.
    ///
    /// # Errors
    /// [`Error::Limit`] when the shelf is full (`u32` handles).
    pub fn put(&mut self, v: V) -> Result<u32, Error> {
        let h = u32::try_from(self.items.len()).map_err(|_| Error::Limit {
            what: "shared objects",
            limit: u64::from(u32::MAX),
            offset: 0,
        })?;
        self.items.push(Some(v));
        Ok(h)
    }

    /// The object behind handle `h`.
    pub fn get_mut(&mut self, h: u32) -> Option<&mut V> {
        self.items.get_mut(h as usize)?.as_mut()
    }

    /// The object behind handle `h`.
    pub fn get(&self, h: u32) -> Option<&V> {
        self.items.get(h as usize)?.as_ref()
    }

    /// Whether nothing was shelved.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Applies `f` to every shelved object (a builder finishing its own values).
    ///
    /// # Errors
    /// The first error of `f`.
    pub fn try_map<W, E>(self, mut f: impl FnMut(V) -> Result<W, E>) -> Result<Shelf<W>, E> {
        let mut items = Vec::with_capacity(self.items.len());
        for v in self.items {
            items.push(match v {
                Some(v) => Some(f(v)?),
                None => None,
            });
        }
        Ok(Shelf { items })
    }

    /// Places every shelved object reached from `root` where its handles are (see [`Shelf`]).
    /// `max_depth` bounds the depth of the finished tree (a shared definition counts as a level); `offset`
    /// is where the pickle ended, for that error.
    ///
    /// # Errors
    /// [`Error::DepthExceeded`] when the finished tree is deeper than `max_depth`.
    pub fn splice<T: Tree<V>>(mut self, root: V, max_depth: usize, offset: usize) -> Result<V, Error> {
        if self.items.is_empty() {
            return Ok(root);
        }
        let n = self.items.len();
        // The handles directly inside each object, and inside the root.
        let mut edges: Vec<Vec<u32>> = Vec::with_capacity(n);
        for item in &self.items {
            let mut e = Vec::new();
            if let Some(v) = item {
                handles_in::<V, T>(v, &mut e);
            }
            edges.push(e);
        }
        let mut root_edges = Vec::new();
        match T::handle(&root) {
            Some(h) => root_edges.push(h),
            None => handles_in::<V, T>(&root, &mut root_edges),
        }
        let (order, component, on_cycle) = analyse(&edges, &root_edges);
        // How many places each object will be in: one per reference from the root or from an object placed
        // once, `k` per reference from an object copied into `k` places. Objects on a cycle are never copied:
        // the references from inside their own cycle count one each, up front (the topological order meets a
        // cycle's objects before all of them are counted).
        let mut places = vec![0u32; n];
        for &h in &order {
            let hi = h as usize;
            if !on_cycle.get(hi).copied().unwrap_or(false) {
                continue;
            }
            for &c in edges.get(hi).map(Vec::as_slice).unwrap_or_default() {
                if component.get(c as usize) == component.get(hi) {
                    if let Some(q) = places.get_mut(c as usize) {
                        *q = q.saturating_add(1);
                    }
                }
            }
        }
        for &r in &root_edges {
            if let Some(p) = places.get_mut(r as usize) {
                *p = p.saturating_add(1);
            }
        }
        let mut place = vec![Place::Unreached; n];
        for &h in &order {
            let hi = h as usize;
            let count = places.get(hi).copied().unwrap_or(0);
            let cyclic = on_cycle.get(hi).copied().unwrap_or(false);
            let mutable = self.items.get(hi).and_then(Option::as_ref).is_some_and(T::is_mutable);
            let p = match count {
                0 | 1 => Place::Inline,
                _ if cyclic || mutable => Place::Shared,
                _ => Place::Copied,
            };
            if let Some(slot) = place.get_mut(hi) {
                *slot = p;
            }
            let each = if p == Place::Copied { count } else { 1 };
            for &c in edges.get(hi).map(Vec::as_slice).unwrap_or_default() {
                // Counted up front.
                if cyclic && component.get(c as usize) == component.get(hi) {
                    continue;
                }
                if let Some(q) = places.get_mut(c as usize) {
                    *q = q.saturating_add(each);
                }
            }
        }
        let counts = places;
        let mut placer = Placer::<V, T> {
            shelf: &mut self,
            place,
            remaining: counts,
            ids: vec![None; n],
            next_id: 0,
            max_depth,
            offset,
            tree: std::marker::PhantomData,
        };
        placer.fill(root)
    }
}

/// The handles directly inside `v` (not inside the objects they stand for).
fn handles_in<V, T: Tree<V>>(v: &V, out: &mut Vec<u32>) {
    let mut stack: Vec<&V> = Vec::new();
    T::children(v, &mut stack);
    while let Some(c) = stack.pop() {
        match T::handle(c) {
            Some(h) => out.push(h),
            None => T::children(c, &mut stack),
        }
    }
}

/// The objects reached from `root` in topological order (an object before every object it holds, a cycle's
/// members together), the component of each (its strongly connected component's number), and which of them
/// are on a cycle (a component of more than one object, or an object that holds itself).
fn analyse(edges: &[Vec<u32>], root: &[u32]) -> (Vec<u32>, Vec<u32>, Vec<bool>) {
    let n = edges.len();
    let mut on_cycle = vec![false; n];
    let mut component = vec![u32::MAX; n];
    let mut components = 0u32;
    // Tarjan's algorithm without recursion: components come out in reverse topological order.
    const UNSEEN: u32 = u32::MAX;
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0u32; n];
    let mut on_stack = vec![false; n];
    let mut stack: Vec<u32> = Vec::new();
    let mut emitted: Vec<u32> = Vec::new();
    let mut next_index = 0u32;
    for &r in root {
        let ri = r as usize;
        if ri >= n || index[ri] != UNSEEN {
            continue;
        }
        // (object, next edge)
        let mut frames: Vec<(u32, usize)> = vec![(r, 0)];
        index[ri] = next_index;
        low[ri] = next_index;
        next_index += 1;
        stack.push(r);
        on_stack[ri] = true;
        while let Some(&mut (v, ref mut next)) = frames.last_mut() {
            let vi = v as usize;
            if let Some(&w) = edges.get(vi).and_then(|e| e.get(*next)) {
                *next += 1;
                let wi = w as usize;
                if wi >= n {
                    continue;
                }
                if wi == vi {
                    on_cycle[vi] = true;
                }
                if index[wi] == UNSEEN {
                    index[wi] = next_index;
                    low[wi] = next_index;
                    next_index += 1;
                    stack.push(w);
                    on_stack[wi] = true;
                    frames.push((w, 0));
                } else if on_stack[wi] {
                    low[vi] = low[vi].min(index[wi]);
                }
                continue;
            }
            frames.pop();
            if let Some(&(parent, _)) = frames.last() {
                let pi = parent as usize;
                low[pi] = low[pi].min(low[vi]);
            }
            if low[vi] == index[vi] {
                // v is the first object of a component: pop the component.
                let first = emitted.len();
                while let Some(w) = stack.pop() {
                    on_stack[w as usize] = false;
                    component[w as usize] = components;
                    emitted.push(w);
                    if w == v {
                        break;
                    }
                }
                components += 1;
                if emitted.len() - first > 1 {
                    for &w in &emitted[first..] {
                        on_cycle[w as usize] = true;
                    }
                }
            }
        }
    }
    emitted.reverse();
    (emitted, component, on_cycle)
}

struct Placer<'s, V, T: Tree<V>> {
    shelf: &'s mut Shelf<V>,
    place: Vec<Place>,
    /// References still to place, per handle (for copies: the last one moves the object).
    remaining: Vec<u32>,
    /// The id of each shared object once its definition is placed.
    ids: Vec<Option<u32>>,
    next_id: u32,
    max_depth: usize,
    offset: usize,
    tree: std::marker::PhantomData<T>,
}

/// A step of [`Placer::fill`].
enum Step<V, S> {
    /// Place the handles in this value, at this depth.
    Visit(V, usize),
    /// Put the last `n` finished values together as this container.
    Join(S, usize),
    /// The last finished value is the definition of shared object `id`.
    Define(u32),
}

impl<V, T: Tree<V>> Placer<'_, V, T> {
    fn take(&mut self, h: u32) -> V {
        self.shelf.items.get_mut(h as usize).and_then(Option::take).unwrap_or_else(T::placeholder)
    }

    /// `root` with every handle replaced, depth first and in order, without recursion.
    fn fill(&mut self, root: V) -> Result<V, Error> {
        let mut steps: Vec<Step<V, T::Shape>> = vec![Step::Visit(root, 1)];
        let mut done: Vec<V> = Vec::new();
        while let Some(step) = steps.pop() {
            match step {
                Step::Visit(v, depth) => {
                    if depth > self.max_depth {
                        return Err(Error::DepthExceeded { limit: self.max_depth, offset: self.offset });
                    }
                    let Some(h) = T::handle(&v) else {
                        match T::split(v) {
                            Ok((shape, children)) => {
                                steps.push(Step::Join(shape, children.len()));
                                steps.extend(children.into_iter().rev().map(|c| Step::Visit(c, depth + 1)));
                            }
                            Err(leaf) => done.push(leaf),
                        }
                        continue;
                    };
                    let hi = h as usize;
                    match self.place.get(hi).copied().unwrap_or(Place::Unreached) {
                        Place::Unreached => done.push(T::placeholder()),
                        Place::Inline => steps.push(Step::Visit(self.take(h), depth)),
                        Place::Copied => {
                            let left = self.remaining.get_mut(hi).map_or(0, |r| {
                                *r = r.saturating_sub(1);
                                *r
                            });
                            let v = if left == 0 {
                                self.take(h)
                            } else {
                                self.shelf.get(h).map_or_else(T::placeholder, T::copy)
                            };
                            steps.push(Step::Visit(v, depth));
                        }
                        Place::Shared => match self.ids.get(hi).copied().flatten() {
                            Some(id) => done.push(T::reference(id)),
                            None => {
                                let id = self.next_id;
                                self.next_id += 1;
                                if let Some(i) = self.ids.get_mut(hi) {
                                    *i = Some(id);
                                }
                                steps.push(Step::Define(id));
                                steps.push(Step::Visit(self.take(h), depth + 1));
                            }
                        },
                    }
                }
                Step::Join(shape, n) => {
                    let children = done.split_off(done.len().saturating_sub(n));
                    done.push(T::join(shape, children));
                }
                Step::Define(id) => {
                    let v = done.pop().unwrap_or_else(T::placeholder);
                    done.push(T::shared(id, v));
                }
            }
        }
        Ok(done.pop().unwrap_or_else(T::placeholder))
    }
}
