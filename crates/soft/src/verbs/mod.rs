//! Verbs objects.
