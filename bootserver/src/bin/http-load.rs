//! `http-load`: GETs one URL over keep-alive HTTP/1.1 connections for a fixed time and
//! prints requests per second and megabytes per second. With a small file it measures
//! request rate, with a large one (a kernel, a node image) throughput.
//!
//! ```sh
//! http-load --url http://10.99.0.1:8080/images/vmlinuz --connections 8 --seconds 5
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Loads one URL.
#[derive(Debug, Parser)]
struct Args {
    /// `http://<ipv4>:<port>/<path>` (no DNS, no TLS: this measures the server).
    #[arg(long)]
    url: String,
    /// Connections in parallel, each sending one request after the other.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// How long to run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

/// The address and path of a plain `http://ip:port/path` URL.
fn split_url(url: &str) -> Result<(SocketAddr, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs"))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr = authority
        .parse()
        .map_err(|e| format!("{url}: {authority:?} is not <ipv4>:<port>: {e}"))?;
    Ok((addr, if path.is_empty() { "/" } else { path }.to_owned()))
}

/// What one connection did.
#[derive(Debug, Default)]
struct Tally {
    requests: u64,
    bytes: u64,
}

async fn one_connection(
    addr: SocketAddr,
    path: String,
    until: Instant,
) -> Result<Tally, std::io::Error> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::with_capacity(1 << 16, read);
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let mut tally = Tally::default();
    let mut sink = vec![0u8; 1 << 16];
    let mut line = String::new();
    while Instant::now() < until {
        write.write_all(request.as_bytes()).await?;
        let mut length: Option<u64> = None;
        let mut status_ok = false;
        loop {
            line.clear();
            if read.read_line(&mut line).await? == 0 {
                return Err(std::io::Error::other("the server closed the connection"));
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if header.starts_with("HTTP/1.1 ") {
                status_ok = header.starts_with("HTTP/1.1 200");
            } else if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().ok();
            }
        }
        if !status_ok {
            return Err(std::io::Error::other(format!("{path}: not 200 OK")));
        }
        let mut left =
            length.ok_or_else(|| std::io::Error::other("response without Content-Length"))?;
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(sink.len());
            let got = read.read(&mut sink[..want]).await?;
            if got == 0 {
                return Err(std::io::Error::other("body cut short"));
            }
            left -= got as u64;
            tally.bytes += got as u64;
        }
        tally.requests += 1;
    }
    Ok(tally)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let (addr, path) = match split_url(&args.url) {
        Ok(parts) => parts,
        Err(message) => {
            eprintln!("http-load: {message}");
            return ExitCode::FAILURE;
        }
    };
    let start = Instant::now();
    let until = start + Duration::from_secs(args.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.connections.max(1) {
        tasks.spawn(one_connection(addr, path.clone(), until));
    }
    let mut total = Tally::default();
    let mut failed = false;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(tally)) => {
                total.requests += tally.requests;
                total.bytes += tally.bytes;
            }
            Ok(Err(error)) => {
                eprintln!("http-load: {error}");
                failed = true;
            }
            Err(error) => {
                eprintln!("http-load: a connection task failed: {error}");
                failed = true;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "requests={} seconds={seconds:.2} req_per_second={:.0} megabytes_per_second={:.1}",
        total.requests,
        total.requests as f64 / seconds,
        total.bytes as f64 / seconds / 1e6
    );
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_split_or_refused() {
        let (addr, path) = split_url("http://10.99.0.1:8080/images/a").unwrap();
        assert_eq!(addr, "10.99.0.1:8080".parse().unwrap());
        assert_eq!(path, "/images/a");
        assert_eq!(split_url("http://127.0.0.1:80").unwrap().1, "/");
        assert!(split_url("https://127.0.0.1:80/").is_err());
        assert!(split_url("http://example.com/").is_err());
    }
}
