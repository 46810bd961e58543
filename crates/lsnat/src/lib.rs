//! rserpool-lsnat.
