//! Scraping a job's Prometheus endpoint in tests: the text format parsed
//! with a Prometheus parser, each sample as metric, labels and value.

/// A sample: metric, its labels (sorted), value.
pub(crate) type Sample = (String, Vec<(String, String)>, f64);

/// The samples of a scrape of `url` (with a bearer `token` if given).
pub(crate) fn scrape(url: &str, token: Option<&str>) -> Vec<Sample> {
    let mut request = ureq::get(url);
    if let Some(token) = token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    let body = request.call().expect("the metrics are served").into_string().expect("a text body");
    let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("the text format");
    parsed
        .samples
        .into_iter()
        .map(|s| {
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                other => panic!("{}: unexpected {other:?}", s.metric),
            };
            let mut labels: Vec<(String, String)> = s.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            labels.sort();
            (s.metric, labels, value)
        })
        .collect()
}

/// The value of the first sample of `metric` (with the label `label`, if given).
pub(crate) fn value(samples: &[Sample], metric: &str, label: Option<(&str, &str)>) -> Option<f64> {
    samples
        .iter()
        .find(|(m, labels, _)| m == metric && label.is_none_or(|(k, v)| labels.iter().any(|(a, b)| a == k && b == v)))
        .map(|s| s.2)
}

/// The sum of the samples of `metric`.
#[allow(dead_code)]
pub(crate) fn sum(samples: &[Sample], metric: &str) -> f64 {
    samples.iter().filter(|(m, _, _)| m == metric).map(|(_, _, v)| v).sum()
}
