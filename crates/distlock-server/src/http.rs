//! The one gate of distlock's HTTP endpoints (`distlock serve --metrics`, `distlock top --http`):
//! who may ask and how, judged from a request's head before anything is served.
//!
//! - Only a loopback `Host` (`localhost`, `127.0.0.1` or any loopback address, `[::1]`, with or
//!   without a port) or the address the endpoint is bound to is answered, unless the endpoint
//!   allows remote readers: a web page that rebinds its own name to 127.0.0.1 (DNS rebinding)
//!   sends its own name, and is refused with 403.
//! - Only `GET` and `HEAD`; any other method is 405 with `Allow: GET, HEAD`.
//! - Every answer carries `X-Content-Type-Options: nosniff`, `Cache-Control: no-store` and
//!   `Connection: close`.

use std::net::{IpAddr, SocketAddr};

/// Who an endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// The address the endpoint listens on (its IP is a `Host` it answers).
    pub bound: SocketAddr,
    /// Answer any `Host` (`--allow-remote`).
    pub allow_remote: bool,
}

/// A request the gate let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The path, without its query.
    pub path: String,
    /// `HEAD`: answer with the head only.
    pub head_only: bool,
}

impl Gate {
    /// The request in `head` (its request line and headers), or the whole reply refusing it.
    pub fn judge(&self, head: &str) -> Result<Request, String> {
        let mut line = head.lines().next().unwrap_or("").split(' ');
        let (method, path) = (line.next().unwrap_or(""), line.next().unwrap_or(""));
        if !self.allow_remote && !host(head).is_some_and(|h| self.answers(h)) {
            let body = "this endpoint answers only requests to localhost, 127.0.0.1 or [::1] \
                        (give --allow-remote to answer other names)\n";
            return Err(reply("403 Forbidden", "text/plain; charset=utf-8", body, false, ""));
        }
        if method != "GET" && method != "HEAD" {
            return Err(reply(
                "405 Method Not Allowed",
                "text/plain; charset=utf-8",
                "only GET\n",
                false,
                "Allow: GET, HEAD\r\n",
            ));
        }
        let path = path.split('?').next().unwrap_or("").to_string();
        Ok(Request { path, head_only: method == "HEAD" })
    }

    /// Whether `host` (a `Host` header's value) names this endpoint on this machine.
    fn answers(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            Some(rest) => rest.split(']').next().unwrap_or(""),
            None => {
                host.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h)
            }
        };
        if name.eq_ignore_ascii_case("localhost") {
            return true;
        }
        name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback() || (ip == self.bound.ip() && !ip.is_unspecified()))
    }
}

/// The value of `head`'s `Host` header, if it has one.
fn host(head: &str) -> Option<&str> {
    head.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim().eq_ignore_ascii_case("host").then(|| value.trim())
    })
}

/// A whole HTTP/1.1 reply; `extra` are more header lines, each ending in `\r\n`.
pub fn reply(status: &str, kind: &str, body: &str, head_only: bool, extra: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nX-Content-Type-Options: nosniff\r\n\
         Cache-Control: no-store\r\n{extra}Connection: close\r\n\r\n{}",
        body.len(),
        if head_only { "" } else { body }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(gate: Gate, method: &str, host: Option<&str>) -> Result<Request, String> {
        let host = host.map(|h| format!("Host: {h}\r\n")).unwrap_or_default();
        gate.judge(&format!("{method} /view?x=1 HTTP/1.1\r\n{host}Accept: */*\r\n\r\n"))
    }

    #[test]
    fn loopback_names_and_the_bound_address_only() {
        let gate = Gate { bound: "10.0.0.5:9500".parse().unwrap(), allow_remote: false };
        for ok in ["localhost", "LOCALHOST:9500", "127.0.0.1", "127.0.0.1:9500", "[::1]", "[::1]:9500", "10.0.0.5:9500"]
        {
            assert_eq!(judged(gate, "GET", Some(ok)), Ok(Request { path: "/view".into(), head_only: false }), "{ok}");
        }
        for bad in [Some("evil.example"), Some("localhost.evil.example"), Some("10.0.0.6"), Some(""), None] {
            assert!(judged(gate, "GET", bad).unwrap_err().starts_with("HTTP/1.1 403"), "{bad:?}");
        }
        let open = Gate { allow_remote: true, ..gate };
        assert!(judged(open, "GET", Some("evil.example")).is_ok());
        let unspecified = Gate { bound: "0.0.0.0:1".parse().unwrap(), allow_remote: false };
        assert!(judged(unspecified, "GET", Some("0.0.0.0")).is_err());
    }

    #[test]
    fn get_and_head_only_and_nosniff_always() {
        let gate = Gate { bound: "127.0.0.1:1".parse().unwrap(), allow_remote: false };
        let post = judged(gate, "POST", Some("localhost")).unwrap_err();
        assert!(post.starts_with("HTTP/1.1 405") && post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
        assert!(post.contains("X-Content-Type-Options: nosniff"));
        assert!(judged(gate, "HEAD", Some("localhost")).unwrap().head_only);
        let head = reply("200 OK", "text/plain", "body", true, "");
        assert!(head.ends_with("Content-Length: 4\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"));
    }
}
