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
