//! Tests of [`super`] on real loopback sockets and files.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn pair() -> (FileSendStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap());
    let (accepted, client) = tokio::join!(listener.accept(), client);
    (FileSendStream::new(accepted.unwrap().0), client.unwrap())
}

fn file_of(content: &[u8]) -> (tempfile::NamedTempFile, Arc<File>) {
    let mut named = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut named, content).unwrap();
    let file = Arc::new(File::open(named.path()).unwrap());
    (named, file)
}

/// Writes every buffer of `bufs` as hyper does: vectored, again after a partial write.
async fn write_all_vectored(stream: &mut FileSendStream, bufs: &[&[u8]]) -> io::Result<()> {
    let mut at: Vec<&[u8]> = bufs.to_vec();
    while at.iter().any(|b| !b.is_empty()) {
        let slices: Vec<IoSlice<'_>> = at
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| IoSlice::new(b))
            .collect();
        let mut written = stream.write_vectored(&slices).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        for b in at.iter_mut() {
            let take = written.min(b.len());
            *b = &b[take..];
            written -= take;
        }
    }
    Ok(())
}

#[tokio::test]
async fn placeholder_bytes_become_the_files_bytes_and_ordinary_bytes_pass() {
    let content: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (_named, file) = file_of(&content);
    let (mut server, mut client) = pair().await;
    let sent = Counter::default();
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        client.read_to_end(&mut all).await.unwrap();
        all
    });

    // A range of the file after a head, in placeholder chunks of uneven sizes.
    assert!(
        server
            .sends()
            .arm(file.clone(), 1000, 2_500_000, sent.clone())
    );
    assert!(
        !server.sends().arm(file.clone(), 0, 10, sent.clone()),
        "one body at a time"
    );
    let head = b"HTTP/1.1 206 Partial Content\r\n\r\n".as_slice();
    write_all_vectored(
        &mut server,
        &[
            head,
            &PLACEHOLDER[..1 << 20],
            &PLACEHOLDER[..1 << 20],
            &PLACEHOLDER[..402_848],
        ],
    )
    .await
    .unwrap();
    // The body is paid: ordinary bytes pass again, and a second body can be armed.
    write_all_vectored(&mut server, &[b"next"]).await.unwrap();
    assert!(server.sends().arm(file, 0, 10, sent.clone()));
    write_all_vectored(&mut server, &[&PLACEHOLDER[..10]])
        .await
        .unwrap();
    server.shutdown().await.unwrap();
    drop(server);

    let all = reader.await.unwrap();
    let mut expected = head.to_vec();
    expected.extend_from_slice(&content[1000..2_501_000]);
    expected.extend_from_slice(b"next");
    expected.extend_from_slice(&content[..10]);
    assert_eq!(all.len(), expected.len());
    assert!(all == expected, "the bytes differ");
    assert_eq!(sent.get(), 2_500_010);
}

#[tokio::test]
async fn placeholder_bytes_never_leave_unarmed_or_copied_or_past_the_file() {
    let (_named, file) = file_of(b"0123456789");
    let (mut server, _client) = pair().await;

    // No file armed.
    let error = write_all_vectored(&mut server, &[&PLACEHOLDER[..5]])
        .await
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);

    // The body copied into the head's buffer (what hyper would do for a stream that
    // does not write vectored).
    assert!(server.sends().arm(file.clone(), 0, 10, Counter::default()));
    let copied = [b"HTTP/1.1 200 OK\r\n\r\n".as_slice(), &[0u8; 10]].concat();
    let error = write_all_vectored(&mut server, &[&copied])
        .await
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);

    // Ordinary bytes inside a started body.
    write_all_vectored(
        &mut server,
        &[b"HTTP/1.1 200 OK\r\n\r\n", &PLACEHOLDER[..4]],
    )
    .await
    .unwrap();
    let error = write_all_vectored(&mut server, &[b"oops"])
        .await
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    // More placeholder bytes than the file part armed.
    let error = write_all_vectored(&mut server, &[&PLACEHOLDER[..7]])
        .await
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);

    // A file that shrank below the length the headers gave.
    let (named, shrinking) = file_of(b"0123456789");
    let (mut server, _client) = pair().await;
    assert!(server.sends().arm(shrinking, 0, 10, Counter::default()));
    std::fs::write(named.path(), b"01").unwrap();
    let error = write_all_vectored(&mut server, &[&PLACEHOLDER[..10]])
        .await
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
}

#[test]
fn file_parts_come_from_the_status_and_headers() {
    use axum::http::{HeaderMap, HeaderValue, header};
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("65535"));
    assert_eq!(file_part(200, &headers), None, "small: read and copied");
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("100000"));
    assert_eq!(file_part(200, &headers), Some((0, 100000)));
    assert_eq!(file_part(304, &headers), None);
    assert_eq!(file_part(206, &headers), None, "no Content-Range");
    headers.insert(
        header::CONTENT_RANGE,
        HeaderValue::from_static("bytes 1000-100999/200000"),
    );
    assert_eq!(file_part(206, &headers), Some((1000, 100000)));
    headers.insert(
        header::CONTENT_RANGE,
        HeaderValue::from_static("bytes 1000-100998/200000"),
    );
    assert_eq!(file_part(206, &headers), None, "length and range disagree");
    headers.insert(
        header::CONTENT_RANGE,
        HeaderValue::from_static("bytes 200000-100000/200000"),
    );
    assert_eq!(file_part(206, &headers), None, "a range backwards");
    assert!(!is_placeholder(&[]));
    assert!(is_placeholder(&PLACEHOLDER[5..9]));
    assert!(!is_placeholder(&[0u8; 4]));
}

#[test]
fn the_body_is_as_long_as_the_part_in_placeholder_chunks() {
    let body = FileBody::new(PLACEHOLDER_BYTES as u64 * 2 + 5);
    assert_eq!(
        body.size_hint().exact(),
        Some(PLACEHOLDER_BYTES as u64 * 2 + 5)
    );
    let mut body = std::pin::pin!(body);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut chunks = Vec::new();
    while let Poll::Ready(Some(Ok(frame))) = body.as_mut().poll_frame(&mut cx) {
        let data = frame.into_data().unwrap();
        assert!(is_placeholder(&data));
        chunks.push(data.len());
    }
    assert_eq!(chunks, vec![PLACEHOLDER_BYTES, PLACEHOLDER_BYTES, 5]);
    assert!(body.is_end_stream());
}

/// An HTTP server over [`FileSendListener`] with `limits`, answering `/` with "ok"; its
/// address.
async fn serve_with(limits: ConnectionLimits) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    tokio::spawn(async move {
        axum::serve(
            FileSendListener::new(listener, limits),
            app.into_make_service_with_connect_info::<HttpConnection>(),
        )
        .await
    });
    addr
}

/// Reads until the peer closes or fails the connection, or `within` passes: whether it did.
async fn closed_within(stream: &mut TcpStream, within: std::time::Duration) -> bool {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// A client that sends half a request head and then nothing (a slow-loris) is cut off once
/// the connection has been idle for the limit; one that keeps talking is not.
#[tokio::test]
async fn an_idle_connection_is_closed_and_a_busy_one_is_not() {
    let addr = serve_with(ConnectionLimits {
        max_connections: 16,
        idle: std::time::Duration::from_secs(1),
    })
    .await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    silent.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
    assert!(
        closed_within(&mut silent, std::time::Duration::from_secs(30)).await,
        "a silent connection outlived its idle limit"
    );
    let mut busy = TcpStream::connect(addr).await.unwrap();
    for _ in 0..4 {
        busy.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = busy.read(&mut buf).await.unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
            "a talking connection is served"
        );
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    }
}

/// With every place taken, the next connection is answered only once one closes.
#[tokio::test]
async fn a_connection_past_the_cap_waits_for_a_place() {
    let addr = serve_with(ConnectionLimits {
        max_connections: 1,
        idle: std::time::Duration::from_secs(600),
    })
    .await;
    let mut holder = TcpStream::connect(addr).await.unwrap();
    holder
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = holder.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let mut waiting = TcpStream::connect(addr).await.unwrap();
    waiting
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let early = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        waiting.read(&mut buf),
    )
    .await;
    assert!(early.is_err(), "answered while the only place was taken");
    drop(holder);
    let n = tokio::time::timeout(std::time::Duration::from_secs(30), waiting.read(&mut buf))
        .await
        .expect("answered once the place was free")
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
}
