//! The tokio runtime that runs the calls of [`enrich_async`](super::EnrichAsync::enrich_async):
//! one per process, made when a job first calls a service and stopped with
//! the job (or, for a computation run without a [`Job`](crate::Job), with
//! the process).

use std::sync::{Arc, OnceLock};

/// The key under which a job's runtime sits in the timely worker configuration.
const KEY: &str = "highwater::enrich::runtime";

/// A process's runtime for calls to services: a multi-threaded tokio
/// runtime of two threads, made on first use. Timely workers never block
/// on it: they spawn the calls and are woken when one completes.
#[derive(Clone, Debug, Default)]
pub struct EnrichRuntime(Arc<OnceLock<Owned>>);

/// The runtime, shut down without waiting when the last handle goes (calls
/// still pending are dropped: the job has ended; dropping it this way is
/// also allowed inside another runtime's thread).
#[derive(Debug)]
struct Owned(Option<tokio::runtime::Runtime>);

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl EnrichRuntime {
    /// Puts a runtime (made on first use) into `config`: the job's
    /// operators share it, and it stops when the job's configuration is
    /// dropped after the run.
    pub fn configure(config: &mut timely::WorkerConfig) -> EnrichRuntime {
        let runtime = EnrichRuntime::default();
        config.set(KEY.to_owned(), runtime.clone());
        runtime
    }

    /// The runtime of the job `scope` belongs to, or the process's own
    /// (for a computation run without a [`Job`](crate::Job)).
    pub fn of(scope: &timely::dataflow::Scope<'_, crate::Timestamp>) -> EnrichRuntime {
        static PROCESS: OnceLock<EnrichRuntime> = OnceLock::new();
        scope
            .worker()
            .config()
            .get::<EnrichRuntime>(KEY)
            .cloned()
            .unwrap_or_else(|| PROCESS.get_or_init(EnrichRuntime::default).clone())
    }

    /// A handle to spawn calls on (the runtime is made on the first call).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.0
            .get_or_init(|| {
                Owned(Some(
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .thread_name("highwater-enrich")
                        .enable_time()
                        .enable_io()
                        .build()
                        .expect("the enrichment runtime starts (threads can be spawned)"),
                ))
            })
            .0
            .as_ref()
            .expect("the runtime is there until the last handle goes")
            .handle()
            .clone()
    }
}
