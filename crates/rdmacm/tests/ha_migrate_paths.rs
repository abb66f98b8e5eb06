//! The migrate policy when the path goes away without a link going down (issue 11; root,
//! SKIPPED otherwise; topology and scenario in `ha/`): H's route to B moved to the second
//! link, and B's address on the first link removed. Either way the side whose path went
//! forces the migration (`IBV_MIG_MIGRATED`) and the other follows the first packet that
//! reaches it on the alternate with MigReq set: the stream goes on byte-exact on the same
//! QPs, both QPs end on port 2, both ids get one ADDR_CHANGE and stay connected.

mod support_ha;
mod support_hosts;

use rdma_soft::verbs::MigrationCause;
use rdma_testhosts::{require_root, Host};
use support_ha::stream::{away_and_back, migrate_under_stream, Causes};
use support_ha::{route_to_h0, route_to_h1, topo};

#[test]
fn a_moved_route_migrates_the_connection() {
    if !require_root("a_moved_route_migrates_the_connection") {
        return;
    }
    let t = topo();
    let moved = |h: &Host, _: &Host| route_to_h1(h);
    let causes = Causes {
        h: Some(MigrationCause::Forced),
        b: Some(MigrationCause::Peer),
    };
    migrate_under_stream(&t, 7494, moved, causes);
    // the link itself never went down
    assert!(t
        .host("h")
        .ip(&["link", "show", "h0", "up"])
        .unwrap()
        .contains("h0"));
}

/// B is the receiver: it has nothing of its own outstanding when its address goes, so its
/// migration announces itself (an ACK with MigReq on the new path) and H follows at once
/// (`Peer`) instead of running out of retries on the dead path.
#[test]
fn the_peers_address_removed_migrates_the_connection() {
    if !require_root("the_peers_address_removed_migrates_the_connection") {
        return;
    }
    let t = topo();
    let removed =
        |_: &Host, b: &Host| support_hosts::sh(b, &["addr", "del", "192.0.2.2/24", "dev", "b0"]);
    let causes = Causes {
        h: Some(MigrationCause::Peer),
        b: Some(MigrationCause::Forced),
    };
    migrate_under_stream(&t, 7495, removed, causes);
}

/// Our own address removed: the same, from H's side (H sends, so its resent requests carry
/// the news).
#[test]
fn our_address_removed_migrates_the_connection() {
    if !require_root("our_address_removed_migrates_the_connection") {
        return;
    }
    let t = topo();
    let removed =
        |h: &Host, _: &Host| support_hosts::sh(h, &["addr", "del", "192.0.2.1/24", "dev", "h0"]);
    let causes = Causes {
        h: Some(MigrationCause::Forced),
        b: Some(MigrationCause::Peer),
    };
    migrate_under_stream(&t, 7496, removed, causes);
}

/// The route moved to h1 and back: the connection follows it to port 2 and, once the route
/// leaves through h0 again, returns there (LAP / APR, then the forced migration back).
#[test]
fn the_route_moved_back_brings_the_connection_back() {
    if !require_root("the_route_moved_back_brings_the_connection_back") {
        return;
    }
    away_and_back(&topo(), false, 7497, route_to_h1, route_to_h0);
}
