//! Prometheus metrics of a feed source (`feed serve --metrics`).
//!
//! Counters are counted where things happen ([`ServeMetrics`], one per process: products
//! inserted, evicted and expired; products and bytes sent by unicast and multicast). The
//! queue and the subscribers are read from the server's status at each scrape (a collector
//! registered by [`super::serve::serve`] when [`super::serve::ServeConfig::registry`] is
//! given): products and bytes queued, subscribers by transport, and each subscriber's backlog
//! (products queued that it has not confirmed) and the bytes sent to it.
//!
//! The subscribe side's ([`SubscribeMetrics`]) are counted from the subscriber's reports.

use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use bulkcast_proto::feed::server::ServerStatus;

/// Labels of a family: `(name, value)` pairs.
type Labels = Vec<(String, String)>;

/// What a feed source did.
#[derive(Debug, Default)]
pub struct ServeMetrics {
    /// Products queued by inserts.
    pub inserted: Counter,
    /// Their bytes.
    pub inserted_bytes: Counter,
    /// Products removed from the queue to make room (size bound) or for age.
    pub removed: Family<Labels, Counter>,
    /// Products whose sending began, by `transport` (`unicast`: to one subscriber, or
    /// `multicast`: to the group).
    pub products_sent: Family<Labels, Counter>,
    /// Product bytes sent, by `transport` (unicast includes repairs).
    pub bytes_sent: Family<Labels, Counter>,
}

/// This process's [`ServeMetrics`].
pub fn global() -> &'static ServeMetrics {
    static GLOBAL: OnceLock<ServeMetrics> = OnceLock::new();
    GLOBAL.get_or_init(ServeMetrics::default)
}

fn label(k: &str, v: &str) -> Labels {
    vec![(k.to_string(), v.to_string())]
}

impl ServeMetrics {
    /// Adds every counter to `reg`.
    pub fn register(&'static self, reg: &mut Registry) {
        reg.register(
            "feed_products_inserted",
            "Products queued by inserts",
            self.inserted.clone(),
        );
        reg.register_with_unit(
            "feed_inserted",
            "Bytes of products queued by inserts",
            Unit::Bytes,
            self.inserted_bytes.clone(),
        );
        reg.register(
            "feed_products_removed",
            "Products removed from the queue, by reason (size: to make room; age)",
            self.removed.clone(),
        );
        reg.register(
            "feed_products_sent",
            "Products whose sending began, by transport (unicast to one subscriber, multicast)",
            self.products_sent.clone(),
        );
        reg.register_with_unit(
            "feed_sent",
            "Product bytes sent, by transport (unicast includes repairs)",
            Unit::Bytes,
            self.bytes_sent.clone(),
        );
    }

    /// Products left the queue, for `reason` (`size` or `age`).
    pub fn removed(&self, reason: &str, n: usize) {
        if n > 0 {
            self.removed
                .get_or_create(&label("reason", reason))
                .inc_by(n as u64);
        }
    }

    /// A product's sending began over `transport`.
    pub fn product_sent(&self, transport: &str) {
        self.products_sent
            .get_or_create(&label("transport", transport))
            .inc();
    }

    /// Product bytes went out over `transport`.
    pub fn sent(&self, transport: &str, bytes: usize) {
        self.bytes_sent
            .get_or_create(&label("transport", transport))
            .inc_by(bytes as u64);
    }
}

/// What a subscriber received (`feed subscribe --metrics`), counted from its reports.
#[derive(Debug)]
pub struct SubscribeMetrics {
    /// Products delivered, by `transport`.
    products: Family<Labels, Counter>,
    /// Their bytes, by `transport`.
    bytes: Family<Labels, Counter>,
    /// Bytes that came by repair.
    repaired: Counter,
    /// Products gone from the source's queue before they got here.
    lost: Counter,
    /// Falls back from multicast to unicast.
    fallbacks: Counter,
    /// Connections lost (then made again).
    disconnects: Counter,
    /// Creation to verified delivery.
    latency: Histogram,
}

impl SubscribeMetrics {
    /// Registers a subscriber's metrics in `reg`.
    pub fn new(reg: &mut Registry) -> SubscribeMetrics {
        let m = SubscribeMetrics {
            products: Family::default(),
            bytes: Family::default(),
            repaired: Counter::default(),
            lost: Counter::default(),
            fallbacks: Counter::default(),
            disconnects: Counter::default(),
            // 1 ms to about 65 s.
            latency: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
        };
        reg.register(
            "feed_products_received",
            "Products delivered verified, by transport (multicast with repairs, or unicast)",
            m.products.clone(),
        );
        reg.register_with_unit(
            "feed_received",
            "Bytes of products delivered, by transport",
            Unit::Bytes,
            m.bytes.clone(),
        );
        reg.register_with_unit(
            "feed_repaired",
            "Bytes of delivered products that came by repair",
            Unit::Bytes,
            m.repaired.clone(),
        );
        reg.register(
            "feed_products_lost",
            "Products gone from the source's queue before they got here",
            m.lost.clone(),
        );
        reg.register(
            "feed_fallbacks",
            "Falls back from multicast to unicast",
            m.fallbacks.clone(),
        );
        reg.register(
            "feed_disconnects",
            "Connections to the source lost (and made again)",
            m.disconnects.clone(),
        );
        reg.register_with_unit(
            "feed_delivery_latency",
            "Product creation to verified delivery",
            Unit::Seconds,
            m.latency.clone(),
        );
        m
    }

    /// Counts what `r` says.
    pub fn count(&self, r: &super::client::Report<'_>) {
        use super::client::Report;
        match r {
            Report::Delivered {
                meta,
                latency,
                repaired,
                multicast,
                ..
            } => {
                let t = label(
                    "transport",
                    if *multicast { "multicast" } else { "unicast" },
                );
                self.products.get_or_create(&t).inc();
                self.bytes.get_or_create(&t).inc_by(meta.size);
                self.repaired.inc_by(*repaired);
                self.latency.observe(latency.total_us as f64 / 1e6);
            }
            Report::Lost { from, to } => {
                self.lost.inc_by(to.saturating_sub(*from) + 1);
            }
            Report::FellBack => {
                self.fallbacks.inc();
            }
            Report::Disconnected { .. } => {
                self.disconnects.inc();
            }
            Report::Subscribed { .. }
            | Report::RefusedClearGroup { .. }
            | Report::Settled { .. }
            | Report::Received { .. } => {}
        }
    }
}

/// The queue and subscribers, read from the server at each scrape (nothing once the server
/// is gone).
pub(super) struct QueueCollector(pub(super) Box<dyn Fn() -> Option<ServerStatus> + Send + Sync>);

impl std::fmt::Debug for QueueCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueueCollector")
    }
}

impl Collector for QueueCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match (self.0)() {
            Some(st) => encode_status(&st, encoder),
            None => Ok(()),
        }
    }
}

/// The metrics of a server's status.
pub fn encode_status(st: &ServerStatus, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let gauge = |enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64| {
        let g = ConstGauge::new(v);
        g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
    };
    gauge(
        &mut enc,
        "feed_queue_products",
        "Products queued",
        st.products as i64,
    )?;
    gauge(
        &mut enc,
        "feed_queue_bytes",
        "Bytes of products queued",
        st.bytes as i64,
    )?;
    gauge(
        &mut enc,
        "feed_queue_max_bytes",
        "The queue's size bound in bytes",
        st.max_bytes as i64,
    )?;
    {
        let g = ConstGauge::new(0i64);
        let mut fam = enc.encode_descriptor(
            "feed_subscribers",
            "Subscribers connected, by transport",
            None,
            g.metric_type(),
        )?;
        for t in ["unicast", "multicast"] {
            let n = st.subscribers.iter().filter(|s| s.transport == t).count();
            let l = label("transport", t);
            ConstGauge::new(n as i64).encode(fam.encode_family(&l)?)?;
        }
    }
    let who = |s: &bulkcast_proto::feed::server::SubStatus| {
        vec![
            ("subscriber".to_string(), s.id.to_string()),
            ("host".to_string(), s.host.clone()),
        ]
    };
    {
        let g = ConstGauge::new(0i64);
        let mut fam = enc.encode_descriptor(
            "feed_subscriber_backlog_products",
            "Products queued after the newest one each subscriber confirmed (its lag)",
            None,
            g.metric_type(),
        )?;
        for s in &st.subscribers {
            let l = who(s);
            ConstGauge::new(s.lag as i64).encode(fam.encode_family(&l)?)?;
        }
    }
    for (name, help, pick) in [
        (
            "feed_subscriber_unicast",
            "Bytes sent to each subscriber over its connection (backlog and feed)",
            (|s| s.unicast_bytes) as fn(&bulkcast_proto::feed::server::SubStatus) -> u64,
        ),
        (
            "feed_subscriber_repair",
            "Bytes of repairs sent to each subscriber",
            |s| s.repair_bytes,
        ),
    ] {
        let c = ConstCounter::new(0u64);
        let mut fam = enc.encode_descriptor(name, help, Some(&Unit::Bytes), c.metric_type())?;
        for s in &st.subscribers {
            let l = who(s);
            ConstCounter::new(pick(s)).encode(fam.encode_family(&l)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkcast_proto::feed::server::SubStatus;

    #[test]
    fn the_status_becomes_queue_and_per_subscriber_metrics() {
        let sub = |id, transport, lag| SubStatus {
            id,
            host: "127.0.0.1".into(),
            feedtype: "ANY".into(),
            transport,
            acked: 3,
            lag,
            unicast_bytes: 1000 * id,
            repair_bytes: 7,
        };
        let st = ServerStatus {
            products: 5,
            bytes: 5000,
            first_seq: Some(1),
            last_seq: Some(5),
            max_bytes: 1 << 20,
            group: None,
            multicast_sent: (0, 0),
            multicast_repair: (0, 0),
            multicast_late_ms: 0,
            subscribers: vec![sub(1, "unicast", 2), sub(2, "multicast", 0)],
            upstream: None,
            relay_children: Vec::new(),
            max_relay_children: 8,
            relays_refused: 0,
        };
        #[derive(Debug)]
        struct Fixed(ServerStatus);
        impl Collector for Fixed {
            fn encode(&self, e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
                encode_status(&self.0, e)
            }
        }
        let mut reg = Registry::with_prefix("bulkcast");
        reg.register_collector(Box::new(Fixed(st)));
        let text = crate::metrics::encode(&reg);
        for line in [
            "bulkcast_feed_queue_products 5",
            "bulkcast_feed_queue_bytes 5000",
            "bulkcast_feed_subscribers{transport=\"unicast\"} 1",
            "bulkcast_feed_subscribers{transport=\"multicast\"} 1",
            "bulkcast_feed_subscriber_backlog_products{subscriber=\"1\",host=\"127.0.0.1\"} 2",
            "bulkcast_feed_subscriber_unicast_bytes_total{subscriber=\"2\",host=\"127.0.0.1\"} 2000",
            "bulkcast_feed_subscriber_repair_bytes_total{subscriber=\"1\",host=\"127.0.0.1\"} 7",
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
    }
}
