//! The receiving side of a spread edge: joins items from any connection back into order.

use std::collections::VecDeque;

/// What [`Joiner::handle_item`] did with an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// First copy: held until every earlier item is released.
    New,
    /// A second copy of an item already held or released (a reassigned item whose first copy
    /// did arrive): dropped. It must still be acknowledged on the connection it came by.
    Duplicate,
}

/// A protocol violation by the sender: the driver closes the edge.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum JoinError {
    /// The sender ran further ahead than the agreed reorder window.
    #[error("item {index} is beyond the reorder window ({next} + {window})")]
    BeyondWindow {
        /// The item's index.
        index: u64,
        /// The oldest item not yet received.
        next: u64,
        /// The window, in items.
        window: u64,
    },
}

/// Joins items that arrive by several connections in any order, and releases them strictly in
/// index order, each exactly once.
///
/// It holds at most `window` items: an item at or beyond `next + window` (where `next` is the
/// oldest item not yet received) is refused with [`JoinError::BeyondWindow`]. The payload `T`
/// is whatever the driver needs to keep (the bytes in the transport, a length in the
/// simulator).
#[derive(Debug)]
pub struct Joiner<T> {
    window: u64,
    /// Next index to release.
    next: u64,
    /// `held[k]` is item `next + k`, if it arrived.
    held: VecDeque<Option<T>>,
    held_count: usize,
    duplicates: u64,
    released: u64,
}

impl<T> Joiner<T> {
    /// A joiner expecting item 0 first, holding at most `window` items (at least 1).
    pub fn new(window: u64) -> Self {
        Self {
            window: window.max(1),
            next: 0,
            held: VecDeque::new(),
            held_count: 0,
            duplicates: 0,
            released: 0,
        }
    }

    /// An item arrived (by any connection).
    pub fn handle_item(&mut self, index: u64, data: T) -> Result<Accepted, JoinError> {
        if index < self.next {
            self.duplicates += 1;
            return Ok(Accepted::Duplicate);
        }
        let k = index - self.next;
        if k >= self.window {
            return Err(JoinError::BeyondWindow {
                index,
                next: self.next,
                window: self.window,
            });
        }
        let k = k as usize;
        if self.held.len() <= k {
            self.held.resize_with(k + 1, || None);
        }
        if self.held[k].is_some() {
            self.duplicates += 1;
            return Ok(Accepted::Duplicate);
        }
        self.held[k] = Some(data);
        self.held_count += 1;
        Ok(Accepted::New)
    }

    /// The next item in order, if it has arrived.
    pub fn poll_release(&mut self) -> Option<(u64, T)> {
        let data = self.held.front_mut()?.take()?;
        self.held.pop_front();
        self.held_count -= 1;
        let index = self.next;
        self.next += 1;
        self.released += 1;
        Some((index, data))
    }

    /// Whether [`Joiner::poll_release`] would return an item.
    pub fn has_ready(&self) -> bool {
        self.held.front().is_some_and(Option::is_some)
    }

    /// The oldest item not yet released (everything before it was released).
    pub fn next_index(&self) -> u64 {
        self.next
    }

    /// Items held, waiting for an earlier one.
    pub fn held(&self) -> usize {
        self.held_count
    }

    /// Items released so far.
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Second copies dropped so far.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// The reorder window, in items.
    pub fn window(&self) -> u64 {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_in_order_drops_duplicates_and_refuses_beyond_window() {
        let mut j = Joiner::new(4);
        assert_eq!(j.handle_item(2, 'c'), Ok(Accepted::New));
        assert_eq!(j.handle_item(1, 'b'), Ok(Accepted::New));
        assert_eq!(j.poll_release(), None);
        assert_eq!(j.handle_item(1, 'x'), Ok(Accepted::Duplicate));
        assert!(matches!(
            j.handle_item(4, 'e'),
            Err(JoinError::BeyondWindow { index: 4, .. })
        ));
        assert_eq!(j.handle_item(0, 'a'), Ok(Accepted::New));
        assert_eq!(j.poll_release(), Some((0, 'a')));
        assert_eq!(j.poll_release(), Some((1, 'b')));
        assert_eq!(j.poll_release(), Some((2, 'c')));
        assert_eq!(j.poll_release(), None);
        assert_eq!(j.handle_item(0, 'y'), Ok(Accepted::Duplicate));
        assert_eq!(j.handle_item(6, 'g'), Ok(Accepted::New));
        assert_eq!(j.held(), 1);
        assert_eq!(j.duplicates(), 2);
        assert_eq!(j.released(), 3);
    }
}
