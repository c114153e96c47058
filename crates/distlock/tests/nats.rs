//! NATS JetStream KV: what only this backend has (the shared scenarios run on it through
//! `on_every_backend!`).
