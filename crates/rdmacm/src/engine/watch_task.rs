//! The change watcher's task on the context's runtime: applies the CM's watch requests,
//! hands host events and per-id notifications to the CM (through the context's queues and
//! its wake eventfd), and watches a migrated connection's new path.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::context::id_entry::IdNum;
use crate::context::run_on::run_on;
use crate::context::state::WatchCmd;
use crate::context::Inner;
use crate::host::watch::Watcher;

/// Resolves a migrated connection's new path and watches it (nothing watched when it
/// does not resolve: logged).
async fn rewatch(
    w: &mut Watcher,
    resolver: &crate::host::resolve::Resolver,
    id: u64,
    local: IpAddr,
    remote: IpAddr,
    link: u32,
) {
    let scoped = |ip: IpAddr| match ip {
        IpAddr::V6(v6) if v6.is_unicast_link_local() => crate::host::ScopedIp::with_index(ip, link),
        _ => crate::host::ScopedIp::new(ip),
    };
    let r = resolver
        .resolve_addr(
            Some(&scoped(local)),
            &scoped(remote),
            None,
            Duration::from_secs(1),
        )
        .await;
    match r {
        Ok(a) => w.watch(id, &a),
        Err(e) => {
            tracing::warn!(target: "rdmacm", id, %local, %remote, error = %e, "migrated path not watched: it does not resolve");
        }
    }
}

/// Starts the change watcher task: host events and per-id notifications for the CM.
pub(crate) fn start_watcher(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    let resolver = inner.resolver.clone();
    let rewatch_resolver = inner.resolver.clone();
    let notify = inner.watch_notify.clone();
    // Subscribed before the context is handed out, so no host change made after
    // `Cma::new` returns can be missed (it used to subscribe whenever the task first ran).
    let w = run_on(
        &inner.rt_handle,
        async move { Watcher::new(&resolver).await },
    );
    inner.rt_handle.spawn(async move {
        let Ok(mut w) = w else {
            return;
        };
        w.track_host();
        let mut rewatches = Vec::new();
        loop {
            {
                let Some(inner) = weak.upgrade() else { return };
                apply_watch_cmds(&inner, &mut w, &mut rewatches);
                let host = w.take_host_events();
                let mut notes = Vec::new();
                while let Some(n) = w.pop() {
                    notes.push(n);
                }
                if !host.is_empty() || !notes.is_empty() {
                    inner
                        .host_events
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(host);
                    inner
                        .notifications
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(notes);
                    inner.wake.signal();
                }
            }
            if !rewatches.is_empty() {
                // outside the block above: the resolution may wait for a neighbour
                for (id, local, remote, link) in rewatches.drain(..) {
                    rewatch(&mut w, &rewatch_resolver, id, local, remote, link).await;
                }
                continue;
            }
            // Only the wait is raced with watch requests (it is cancel-safe); the processing
            // of a host change runs to completion, so a request arriving mid-way cannot
            // cancel it and lose the change.
            let ev = tokio::select! {
                _ = notify.notified() => continue,
                ev = w.next_event() => ev,
            };
            match ev {
                Ok(ev) => {
                    // The requests queued without a wake-up first: an id resolved before
                    // this change is judged by it.
                    let Some(inner) = weak.upgrade() else { return };
                    apply_watch_cmds(&inner, &mut w, &mut rewatches);
                    drop(inner);
                    // Host events reach the CM at once (a link down sets its port's state,
                    // which migrates the group's connections), before the watched ids are
                    // judged (route and neighbour lookups that may wait).
                    w.note_host(&ev);
                    let host = w.take_host_events();
                    if !host.is_empty() {
                        let Some(inner) = weak.upgrade() else { return };
                        inner
                            .host_events
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .extend(host);
                        inner.wake.signal();
                    }
                    if w.handle_event(ev).await.is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
}

/// Applies the watch requests queued for the watcher task (rewatches are collected for
/// the task to resolve).
fn apply_watch_cmds(
    inner: &Inner,
    w: &mut Watcher,
    rewatches: &mut Vec<(IdNum, std::net::IpAddr, std::net::IpAddr, u32)>,
) {
    let cmds: Vec<WatchCmd> =
        std::mem::take(&mut *inner.watch_cmds.lock().unwrap_or_else(|e| e.into_inner()));
    for c in cmds {
        match c {
            WatchCmd::Watch(id, a) => w.watch(id, &a),
            WatchCmd::Rewatch(id, local, remote, link) => {
                rewatches.push((id, local, remote, link));
            }
            WatchCmd::Unwatch(id) => {
                rewatches.retain(|r| r.0 != id);
                w.unwatch(id);
            }
        }
    }
}
