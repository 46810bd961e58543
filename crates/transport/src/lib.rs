//! rserpool-transport.
