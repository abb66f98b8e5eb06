//! The tokio bridge: running resolver futures from blocking threads.

use std::future::Future;

/// Runs a future on `handle` from any thread (also from inside another runtime, where
/// `block_on` would panic). It is first polled once in the calling thread (inside the
/// runtime's context): netlink queries complete there (the kernel answers within the
/// request's `send`), so bind, resolve_addr on loopback and resolve_route cost no thread
/// hop. A future that is still pending (neighbour resolution, a timer) is spawned and
/// awaited as before; it is polled again with the runtime's waker.
pub(crate) fn run_on<F, T>(handle: &tokio::runtime::Handle, f: F) -> T
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut f = Box::pin(f);
    {
        let _cx = handle.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = tx.send(f.await);
    });
    match rx.recv() {
        Ok(v) => v,
        // The runtime was shut down under us: only at teardown.
        Err(_) => std::process::abort(),
    }
}

/// The async twin of [`run_on`]: runs a future on `handle` and awaits it from a task of any
/// runtime (or from [`block_here`]). Polled once here first, inside the runtime's context
/// (netlink answers are there at once); a future still pending is spawned on `handle` and
/// the caller's task waits for it without holding a thread.
pub(crate) async fn await_on<F, T>(handle: &tokio::runtime::Handle, f: F) -> crate::error::Result<T>
where
    F: Future<Output = crate::error::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let mut f = Box::pin(f);
    {
        let _cx = handle.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
    handle
        .spawn(f)
        .await
        .map_err(|_| crate::error::Error::Shutdown)?
}

/// Runs `f` to completion in the calling thread, which sleeps between polls: the blocking
/// API over the CM's async operations (any thread, also a runtime's worker, as `run_on`).
pub(crate) fn block_here<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}
