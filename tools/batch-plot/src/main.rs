//! Draws the micro-batch curve: throughput and p99 latency against the batch
//! size, one line per query and worker count, from the CSV that
//! `scripts/batch_curve.sh` prints.
//!
//! ```text
//! cargo run --release --manifest-path tools/batch-plot/Cargo.toml -- \
//!     docs/batch_curve.csv docs/batch_curve.png /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
//! ```

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use plotters::prelude::*;
use plotters::style::FontStyle;

/// One measured point: batch size, events per second, p99 latency in µs.
type Point = (f64, f64, f64);

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, csv, png, font] = args.as_slice() else {
        bail!("usage: batch-plot CSV PNG FONT.ttf");
    };
    let font: &'static [u8] = Box::leak(std::fs::read(font).with_context(|| format!("reading {font}"))?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("not a font this renderer reads"))?;

    let text = std::fs::read_to_string(csv).with_context(|| format!("reading {csv}"))?;
    let mut series: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let [query, workers, batch, rate, _p50, p99, _kind] = f.as_slice() else {
            bail!("{csv}:{}: expected 7 fields", n + 1);
        };
        let parse = |s: &str| s.parse::<f64>().with_context(|| format!("{csv}:{}: {s:?}", n + 1));
        let label = format!("{query}, {workers} worker{}", if *workers == "1" { "" } else { "s" });
        series.entry(label).or_default().push((parse(batch)?, parse(rate)?, parse(p99)?));
    }
    if series.is_empty() {
        bail!("{csv} holds no points");
    }
    let all = || series.values().flatten();
    let max_batch = all().map(|p| p.0).fold(1.0, f64::max);
    let max_rate = all().map(|p| p.1 / 1e6).fold(0.0, f64::max) * 1.1;
    let (min_p99, max_p99) = all().fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.2), hi.max(p.2)));

    let root = BitMapBackend::new(png, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(700);
    let colours = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];

    let mut throughput = ChartBuilder::on(&left)
        .caption("Throughput (--discard, full speed)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((1f64..max_batch * 2.0).log_scale(), 0f64..max_rate)?;
    throughput
        .configure_mesh()
        .x_desc("--batch-size (records per source read)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("M events/s")
        .label_style(("sans-serif", 16))
        .draw()?;
    let mut latency = ChartBuilder::on(&right)
        .caption("p99 latency (q1 read → sink, q7 watermark → sink)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((1f64..max_batch * 2.0).log_scale(), (min_p99 / 2.0..max_p99 * 2.0).log_scale())?;
    latency
        .configure_mesh()
        .x_desc("--batch-size (records per source read)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .y_desc("p99 µs")
        .label_style(("sans-serif", 16))
        .draw()?;

    for (i, (label, points)) in series.iter().enumerate() {
        let colour = colours[i % colours.len()];
        let style = ShapeStyle::from(colour).stroke_width(2);
        throughput
            .draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.1 / 1e6)), style))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        throughput.draw_series(points.iter().map(|p| Circle::new((p.0, p.1 / 1e6), 4, colour.filled())))?;
        latency
            .draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.2)), style))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        latency.draw_series(points.iter().map(|p| Circle::new((p.0, p.2), 4, colour.filled())))?;
    }
    throughput
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    latency
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
