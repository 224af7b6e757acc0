//! The stager: parallel copies into and out of a mount (`tierstack stage`).
