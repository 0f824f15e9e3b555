//! Prometheus metrics of the bootserver (`/metrics`).

use dhcproto::v4::MessageType;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::dhcp::DropReason;

/// A DHCP message type label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    /// DISCOVER, OFFER, ...
    pub r#type: String,
}

/// A reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why a packet was dropped ([`DropReason::as_str`]).
    pub reason: &'static str,
}

/// A service of the bootserver, as a metric label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Service {
    /// DHCP and ProxyDHCP.
    Dhcp,
    /// TFTP.
    Tftp,
    /// HTTP.
    Http,
}

/// A service label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabel {
    /// `dhcp`, `tftp` or `http`.
    pub service: &'static str,
}

/// A refusal's label (TFTP requests, boot scripts).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TftpReasonLabel {
    /// Why it was refused.
    pub reason: &'static str,
}

/// An HTTP route label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// The route.
    pub route: String,
    /// The status code.
    pub code: u16,
}

/// The bootserver's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    /// DHCP packets received, by message type.
    pub dhcp_received: Family<TypeLabel, Counter>,
    /// DHCP packets sent, by message type (offers, acks, naks).
    pub dhcp_sent: Family<TypeLabel, Counter>,
    /// DHCP packets dropped, by reason (malformed ones among them).
    pub dhcp_dropped: Family<ReasonLabel, Counter>,
    /// DHCPv6 messages received, by message type.
    pub dhcp6_received: Family<TypeLabel, Counter>,
    /// DHCPv6 replies sent, by message type.
    pub dhcp6_sent: Family<TypeLabel, Counter>,
    /// DHCPv6 messages not answered, by reason.
    pub dhcp6_dropped: Family<ReasonLabel, Counter>,
    /// Panics caught while handling one request, by service: the request was dropped and
    /// the service went on.
    pub panics: Family<ServiceLabel, Counter>,
    /// Leases that have not expired.
    pub active_leases: Gauge,
    /// Offers taken back from a client that never requested them, because its pool ran out
    /// (a flood of DISCOVERs): what was shed.
    pub dhcp_offers_reclaimed: Counter,
    /// 1 while the lease log's last write failed (a full disk): no ACK goes out until a
    /// write succeeds again.
    pub dhcp_lease_log_failing: Gauge,
    /// Writes of the lease log that failed (nothing of them became durable).
    pub dhcp_lease_log_failed_writes: Gauge,
    /// TFTP transfers started.
    pub tftp_transfers: Counter,
    /// TFTP requests refused, by reason (missing file, hostile path, malformed, busy).
    pub tftp_refused: Family<TftpReasonLabel, Counter>,
    /// Bytes read from files for TFTP transfers.
    pub tftp_bytes: Counter,
    /// HTTP requests, by route and status.
    pub http_requests: Family<RouteLabel, Counter>,
    /// Bytes of files (images, iPXE builds) sent over HTTP by the kernel (`sendfile`).
    pub http_file_bytes_sent: Counter,
    /// Boot scripts refused to a peer not vouched for as the machine, by reason
    /// ([`crate::identity::Unvouched::label`]).
    pub scripts_refused: Family<TftpReasonLabel, Counter>,
}

fn type_name(kind: Option<MessageType>) -> String {
    kind.map_or_else(|| "none".to_owned(), |k| format!("{k:?}").to_uppercase())
}

impl Metrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("unbounded_bootserver");
        r.register(
            "dhcp_received",
            "DHCP packets received by type",
            m.dhcp_received.clone(),
        );
        r.register(
            "dhcp_sent",
            "DHCP replies sent by type",
            m.dhcp_sent.clone(),
        );
        r.register(
            "dhcp_dropped",
            "DHCP packets dropped by reason",
            m.dhcp_dropped.clone(),
        );
        r.register(
            "dhcp6_received",
            "DHCPv6 messages received by type",
            m.dhcp6_received.clone(),
        );
        r.register(
            "dhcp6_sent",
            "DHCPv6 replies sent by type",
            m.dhcp6_sent.clone(),
        );
        r.register(
            "dhcp6_dropped",
            "DHCPv6 messages not answered, by reason",
            m.dhcp6_dropped.clone(),
        );
        r.register(
            "panics",
            "Panics caught while handling one request (the request was dropped)",
            m.panics.clone(),
        );
        r.register(
            "dhcp_active_leases",
            "Leases not expired",
            m.active_leases.clone(),
        );
        r.register(
            "dhcp_offers_reclaimed",
            "DHCP offers taken back from clients that never requested them (pool exhausted)",
            m.dhcp_offers_reclaimed.clone(),
        );
        r.register(
            "dhcp_lease_log_failing",
            "1 while the lease log's last write failed (no ACK until one succeeds)",
            m.dhcp_lease_log_failing.clone(),
        );
        r.register(
            "dhcp_lease_log_failed_writes",
            "Lease log writes that failed since the start",
            m.dhcp_lease_log_failed_writes.clone(),
        );
        r.register(
            "tftp_transfers",
            "TFTP transfers started",
            m.tftp_transfers.clone(),
        );
        r.register(
            "tftp_bytes",
            "Bytes of files sent over TFTP",
            m.tftp_bytes.clone(),
        );
        r.register(
            "tftp_refused",
            "TFTP requests refused",
            m.tftp_refused.clone(),
        );
        r.register(
            "http_requests",
            "HTTP requests by route and status",
            m.http_requests.clone(),
        );
        r.register(
            "http_file_bytes_sent",
            "Bytes of files sent over HTTP by the kernel (sendfile)",
            m.http_file_bytes_sent.clone(),
        );
        r.register(
            "boot_scripts_refused",
            "Boot scripts refused to a peer the bootserver does not vouch for as the machine, by reason",
            m.scripts_refused.clone(),
        );
        m
    }

    /// Counts a received DHCP packet.
    pub fn dhcp_received(&self, kind: Option<MessageType>) {
        self.dhcp_received
            .get_or_create(&TypeLabel {
                r#type: type_name(kind),
            })
            .inc();
    }

    /// Counts a sent DHCP reply.
    pub fn dhcp_sent(&self, kind: Option<MessageType>) {
        self.dhcp_sent
            .get_or_create(&TypeLabel {
                r#type: type_name(kind),
            })
            .inc();
    }

    /// Counts a dropped DHCP packet.
    pub fn dhcp_dropped(&self, reason: DropReason) {
        self.dhcp_dropped
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts a DHCPv6 message received (`sent` false) or a reply sent, by its type.
    pub fn dhcp6_message(&self, sent: bool, kind: dhcproto::v6::MessageType) {
        let family = if sent {
            &self.dhcp6_sent
        } else {
            &self.dhcp6_received
        };
        family
            .get_or_create(&TypeLabel {
                r#type: format!("{kind:?}").to_uppercase(),
            })
            .inc();
    }

    /// Counts a DHCPv6 message not answered.
    pub fn dhcp6_dropped(&self, reason: &'static str) {
        self.dhcp6_dropped
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts a panic caught in a service.
    pub fn panic(&self, service: Service) {
        let service = match service {
            Service::Dhcp => "dhcp",
            Service::Tftp => "tftp",
            Service::Http => "http",
        };
        self.panics.get_or_create(&ServiceLabel { service }).inc();
    }

    /// Counts a refused TFTP request.
    pub fn tftp_refused(&self, reason: &'static str) {
        self.tftp_refused
            .get_or_create(&TftpReasonLabel { reason })
            .inc();
    }

    /// Counts a boot script refused to a peer not vouched for.
    pub fn script_refused(&self, reason: &'static str) {
        self.scripts_refused
            .get_or_create(&TftpReasonLabel { reason })
            .inc();
    }

    /// Counts an HTTP request.
    pub fn http_request(&self, route: &str, code: u16) {
        self.http_requests
            .get_or_create(&RouteLabel {
                route: route.to_owned(),
                code,
            })
            .inc();
    }
}
