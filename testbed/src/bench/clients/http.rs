//! A minimal HTTP/1.1 GET (one request per connection, as iPXE makes them), counting the
//! body's bytes and keeping it only when asked (the boot script, not the kernel).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Why a GET failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// Socket trouble.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// The response had no complete header.
    #[error("malformed response")]
    Malformed,
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Bytes in the body.
    pub length: u64,
    /// The body, when kept.
    pub body: Vec<u8>,
}

/// The status code of a response head (`HTTP/1.1 200 OK\r\n…`).
pub fn status_of(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.split_whitespace();
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    parts.next()?.parse().ok()
}

/// GETs `path` from `server` with `Connection: close` and reads to the end.
pub async fn get(
    server: SocketAddr,
    path: &str,
    keep_body: bool,
) -> Result<Response, HttpClientError> {
    let mut stream = TcpStream::connect(server).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {server}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut buf = vec![0u8; 1 << 16];
    let mut head = Vec::new();
    let mut body = Vec::new();
    let mut length: u64 = 0;
    let mut status = None;
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let chunk = buf.get(..n).unwrap_or_default();
        match status {
            Some(_) => {
                length += n as u64;
                if keep_body {
                    body.extend_from_slice(chunk);
                }
            }
            None => {
                head.extend_from_slice(chunk);
                if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                    status = Some(status_of(&head).ok_or(HttpClientError::Malformed)?);
                    let rest = head.get(end + 4..).unwrap_or_default();
                    length += rest.len() as u64;
                    if keep_body {
                        body.extend_from_slice(rest);
                    }
                }
            }
        }
    }
    Ok(Response {
        status: status.ok_or(HttpClientError::Malformed)?,
        length,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_read_from_the_first_line() {
        assert_eq!(
            status_of(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"),
            Some(200)
        );
        assert_eq!(status_of(b"HTTP/1.1 404 Not Found\r\n"), Some(404));
        assert_eq!(status_of(b"garbage"), None);
    }
}
