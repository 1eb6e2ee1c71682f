// Actor system helpers (filled in).
