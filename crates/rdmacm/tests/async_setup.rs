//! Setup hooks: a server registers memory in its own PD before accepting and puts the
//! region in the REP's private data; a client does the same before its REQ; the private
//! data limits (56 for a REQ after the IP CM header, 196 for a REP) exactly.
//!
//! Each test on its own 127.0.61.x address (10-19).

use std::net::SocketAddr;

use rdmacm::cm::Cma;
use rdmacm::verbs::{AccessFlags, QpCap};
use rdmacm::{
    AcceptOptions, Buf, ConnectOptions, Connection, Error, Listener, RemoteBuf, Setup,
    MAX_REP_PRIVATE_DATA, MAX_REQ_PRIVATE_DATA,
};

mod support_async;
use support_async::*;

async fn listener(ip: &str) -> (Cma, Listener, ConnectOptions) {
    let cma = Cma::new().unwrap();
    let l = Listener::builder()
        .cma(cma.clone())
        .bind(format!("{ip}:0").parse().unwrap())
        .await
        .unwrap();
    let opts = ConnectOptions::new()
        .src(SocketAddr::new(l.local_addr().unwrap().ip(), 0))
        .cma(cma.clone());
    (cma, l, opts)
}

const MIB: usize = 1 << 20;

/// The server allocates a PD on the request's device, registers 1 MiB, and accepts with
/// the region's RemoteBuf in 196 bytes of private data (the most a REP carries); the
/// client gets exactly those 196 bytes and WRITEs into the region at once; the server's
/// connection uses the server's own PD and the given queue sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_registers_before_accept_and_sends_its_rkey_in_196_bytes() {
    let (_cma, l, opts) = listener("127.0.61.10").await;
    assert!(l.device().is_some(), "a specific listener knows its device");
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let req = l.incoming().await.unwrap();
        assert_eq!(&req.private_data()[..5], b"hello");
        let pd = req.device().alloc_pd().unwrap();
        let mr = pd
            .register(
                vec![0u8; MIB],
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        let mut pdata = vec![0xa5u8; MAX_REP_PRIVATE_DATA];
        pdata[..16].copy_from_slice(&RemoteBuf::of(&mr).to_bytes());
        let opts = AcceptOptions {
            private_data: pdata,
            setup: Setup {
                pd: Some(pd.clone()),
                cq_size: 1024,
                cap: QpCap {
                    max_send_wr: 300,
                    ..Default::default()
                },
            },
            ..Default::default()
        };
        let c = req.accept(opts).await.unwrap();
        assert_eq!(c.pd().id(), pd.id(), "the connection uses the server's PD");
        assert!(c.cq().capacity() >= 1024);
        assert!(c.qp().cap().max_send_wr >= 300);
        // The client's WRITE landed before its message "written".
        assert_eq!(c.recv().await.unwrap(), b"written");
        (c, mr)
    });
    let opts = opts.private_data(b"hello".to_vec());
    let c = within("connect", Connection::connect(addr, opts))
        .await
        .unwrap();
    let pd = c.peer_private_data();
    assert_eq!(
        pd.len(),
        MAX_REP_PRIVATE_DATA,
        "the REP's private data, whole"
    );
    assert!(
        pd[16..].iter().all(|&b| b == 0xa5),
        "private data after the RemoteBuf"
    );
    let remote = RemoteBuf::from_bytes(pd).unwrap();
    assert_eq!(remote.len as usize, MIB);
    let data: Vec<u8> = (0..MIB).map(|i| (i * 7 + i / 1000) as u8).collect();
    let (r, _) = within("write", c.write_buf(&remote, Buf::from(data.clone()))).await;
    r.unwrap();
    c.send(b"written").await.unwrap();
    let (s, mr) = within("server", server).await.unwrap();
    assert!(
        mr.to_vec() == data,
        "the server's region holds the client's bytes"
    );
    within("disconnect", c.disconnect()).await.unwrap();
    drop(s);
}

/// 197 bytes of REP private data: accept fails with EINVAL naming the limit (it does
/// not wait forever), and the client is refused at once instead of waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rep_private_data_over_196_bytes_fails_accept_and_refuses_the_client() {
    let (_cma, l, opts) = listener("127.0.61.11").await;
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let opts = AcceptOptions {
            private_data: vec![1u8; MAX_REP_PRIVATE_DATA + 1],
            ..Default::default()
        };
        l.accept_with(opts).await
    });
    let e = within("connect", Connection::connect(addr, opts))
        .await
        .unwrap_err();
    assert_eq!(e.errno(), libc::ECONNREFUSED, "{e}");
    let e = within("accept", server).await.unwrap().unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(e.to_string().contains("196"), "{e}");
}

/// The client resolves, allocates a PD on the resolved device, registers a region and
/// connects with its RemoteBuf in 56 bytes of REQ private data (the most after the IP CM
/// header); the server READs the region the client filled. 57 bytes are EINVAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_registers_before_connect_and_sends_its_rkey_in_56_bytes() {
    let (_cma, l, opts) = listener("127.0.61.12").await;
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let c = l.accept().await.unwrap();
        let pd = c.peer_private_data();
        assert_eq!(pd.len(), MAX_REQ_PRIVATE_DATA);
        assert!(pd[16..].iter().all(|&b| b == 0x5a));
        let remote = RemoteBuf::from_bytes(pd).unwrap();
        let (r, back) = c.read_buf(&remote, Buf::zeroed(remote.len as usize)).await;
        r.unwrap();
        c.send(b"read").await.unwrap();
        (c, back.to_vec())
    });
    // Over the limit first: refused before anything leaves.
    let mut too_long = Connection::resolve(addr, opts.clone()).await.unwrap();
    too_long.options_mut().private_data = vec![0; MAX_REQ_PRIVATE_DATA + 1];
    let e = too_long.connect().await.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");

    let mut r = within("resolve", Connection::resolve(addr, opts))
        .await
        .unwrap();
    let pd = r.device().alloc_pd().unwrap();
    let content: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
    let mr = pd
        .register(
            content.clone(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let mut pdata = vec![0x5au8; MAX_REQ_PRIVATE_DATA];
    pdata[..16].copy_from_slice(&RemoteBuf::of(&mr).to_bytes());
    r.options_mut().private_data = pdata;
    r.options_mut().setup.pd = Some(pd.clone());
    let c = within("connect", r.connect()).await.unwrap();
    assert_eq!(c.pd().id(), pd.id());
    assert_eq!(within("recv", c.recv()).await.unwrap(), b"read");
    let (s, back) = within("server", server).await.unwrap();
    assert!(back == content, "the server read the client's region");
    within("disconnect", c.disconnect()).await.unwrap();
    drop(s);
}

/// The server rejects a request it inspected: the client's error names the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incoming_reject_refuses_the_client_naming_the_reason() {
    let (_cma, l, opts) = listener("127.0.61.13").await;
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let req = l.incoming().await.unwrap();
        req.reject(b"go away").unwrap();
        // A dropped request is rejected too.
        drop(l.incoming().await.unwrap());
    });
    for _ in 0..2 {
        let e = within("connect", Connection::connect(addr, opts.clone()))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::ConnectionRefused(28)), "{e:?}");
        assert!(e.to_string().contains("consumer"), "{e}");
    }
    within("server", server).await.unwrap();
}

/// `Connection::resolve` (bind, address and route resolution) awaits netlink on the
/// caller's runtime: it completes while every thread of the runtime's blocking pool is
/// taken (it used to run there and waited for a free thread).
#[test]
fn resolve_needs_no_blocking_thread() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_cma, l, opts) = listener("127.0.61.14").await;
        let (busy_tx, busy_rx) = std::sync::mpsc::channel::<()>();
        let busy = tokio::task::spawn_blocking(move || busy_rx.recv());
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            Connection::resolve(l.local_addr().unwrap(), opts),
        )
        .await
        .expect("resolved with the blocking pool taken")
        .unwrap();
        assert_eq!(r.device().name(), "lo");
        drop(busy_tx);
        busy.await.unwrap().unwrap_err();
    });
}

/// `Connection::connect` and `Listener::accept` make their QP, CQ and buffers and send the
/// REQ / REP on the caller's runtime: both complete while every thread of the runtime's
/// blocking pool is taken (they used to wait there for a free thread), and the connection
/// carries a message.
#[test]
fn connect_and_accept_need_no_blocking_thread() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_cma, l, opts) = listener("127.0.61.15").await;
        let addr = l.local_addr().unwrap();
        let (busy_tx, busy_rx) = std::sync::mpsc::channel::<()>();
        let busy = tokio::task::spawn_blocking(move || busy_rx.recv());
        let server = tokio::spawn(async move {
            let c = l.accept().await?;
            c.recv().await
        });
        let limit = std::time::Duration::from_secs(20);
        let c = tokio::time::timeout(limit, Connection::connect(addr, opts))
            .await
            .expect("connected with the blocking pool taken")
            .unwrap();
        c.send(b"no hop").await.unwrap();
        let got = tokio::time::timeout(limit, server)
            .await
            .expect("accepted with the blocking pool taken")
            .unwrap()
            .unwrap();
        assert_eq!(got, b"no hop");
        drop(busy_tx);
        busy.await.unwrap().unwrap_err();
    });
}
