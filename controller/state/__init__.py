"""The controller's in-memory state of the cluster: records (what is kept), their decoding from
the wire, the indices over them, and the questions the reconcilers ask of it."""
