//! One request/response exchange over the rtnetlink connection.

use futures::StreamExt;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_route::RouteNetlinkMessage;

use crate::error::{Error, Result};

/// Sends `msg` with `NLM_F_REQUEST | flags` and collects the answers (a dump's parts, the
/// single reply of a get, nothing for a bare ACK). A NACK becomes [`Error::from_errno`].
pub(crate) async fn request(
    handle: &rtnetlink::Handle,
    op: &'static str,
    msg: RouteNetlinkMessage,
    flags: u16,
) -> Result<Vec<RouteNetlinkMessage>> {
    let mut req = NetlinkMessage::from(msg);
    req.header.flags = NLM_F_REQUEST | flags;
    let mut handle = handle.clone();
    let mut answers = handle
        .request(req)
        .map_err(|e| Error::Netlink(format!("{op}: {e}")))?;
    let mut out = Vec::new();
    while let Some(m) = answers.next().await {
        match m.payload {
            NetlinkPayload::InnerMessage(inner) => out.push(inner),
            NetlinkPayload::Error(e) if e.raw_code() != 0 => {
                return Err(Error::from_errno(op, e.raw_code()))
            }
            _ => {}
        }
    }
    Ok(out)
}
