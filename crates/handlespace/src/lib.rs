//! rserpool-handlespace.
