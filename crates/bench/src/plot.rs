//! Latency percentiles against offered load, both profiles on one chart: drawn as SVG by
//! plotters, rasterised to PNG by resvg (pure Rust; text in the system's fonts).

use std::path::Path;

use anyhow::{anyhow, Context};
use plotters::prelude::*;

/// One profile's sweep: (offered transfers/s, p50 ms, p99 ms) per load.
#[derive(Debug, Clone)]
pub struct Series {
    pub profile: String,
    pub points: Vec<(f64, f64, f64)>,
}

/// Writes `<stem>.svg` and `<stem>.png`.
pub fn latency_vs_load(
    series: &[Series],
    title: &str,
    svg_path: &Path,
    png_path: &Path,
) -> anyhow::Result<()> {
    let max_rate = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(1.0, f64::max) * 1.05;
    let max_ms = series.iter().flat_map(|s| s.points.iter().map(|p| p.2)).fold(10.0, f64::max) * 1.5;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 620)).into_drawing_area();
        root.fill(&WHITE).map_err(|error| anyhow!("{error}"))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..max_rate, (1f64..max_ms).log_scale())
            .map_err(|error| anyhow!("{error}"))?;
        chart
            .configure_mesh()
            .x_desc("offered load (transfers/s, open loop)")
            .y_desc("latency POST → final status (ms, log)")
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|error| anyhow!("{error}"))?;
        let colours = [RGBColor(0xd6, 0x27, 0x28), RGBColor(0x1f, 0x77, 0xb4), RGBColor(0x2c, 0xa0, 0x2c)];
        for (index, one) in series.iter().enumerate() {
            let colour = colours[index % colours.len()];
            for (label, pick, dashed) in [("p50", 1usize, false), ("p99", 2usize, true)] {
                let points: Vec<(f64, f64)> =
                    one.points.iter().map(|p| (p.0, if pick == 1 { p.1 } else { p.2 }.max(1.0))).collect();
                let style = colour.stroke_width(if dashed { 1 } else { 3 });
                chart
                    .draw_series(LineSeries::new(points.clone(), style))
                    .map_err(|error| anyhow!("{error}"))?
                    .label(format!("{} {label}", one.profile))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
                chart
                    .draw_series(points.into_iter().map(|point| Circle::new(point, 4, colour.filled())))
                    .map_err(|error| anyhow!("{error}"))?;
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(|error| anyhow!("{error}"))?;
        root.present().map_err(|error| anyhow!("{error}"))?;
    }
    std::fs::write(svg_path, &svg).with_context(|| format!("write {}", svg_path.display()))?;
    rasterise(&svg, png_path)
}

fn rasterise(svg: &str, png_path: &Path) -> anyhow::Result<()> {
    let mut options = resvg::usvg::Options::default();
    options.fontdb_mut().load_system_fonts();
    // plotters names the generic family, which resvg maps to Arial unless told: use DejaVu Sans
    // (scripts/stack installs fonts-dejavu-core), else whatever font the machine has
    let families: Vec<String> =
        options.fontdb.faces().flat_map(|face| face.families.iter().map(|(name, _)| name.clone())).collect();
    let family = families
        .iter()
        .find(|name| name.as_str() == "DejaVu Sans")
        .or_else(|| families.first())
        .cloned()
        .ok_or_else(|| {
            anyhow!("no system fonts to draw the plot's text (scripts/stack up installs fonts-dejavu-core)")
        })?;
    options.fontdb_mut().set_sans_serif_family(family);
    let tree = resvg::usvg::Tree::from_str(svg, &options).context("parse the plot")?;
    let size = tree.size().to_int_size();
    let mut pixmap =
        resvg::tiny_skia::Pixmap::new(size.width(), size.height()).ok_or_else(|| anyhow!("empty plot"))?;
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.save_png(png_path).with_context(|| format!("write {}", png_path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_is_written_as_svg_and_png() {
        let dir = std::env::temp_dir().join(format!("pagamentos-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let series = [
            Series { profile: "fast".into(), points: vec![(100.0, 20.0, 40.0), (400.0, 30.0, 90.0)] },
            Series {
                profile: "reference".into(),
                points: vec![(25.0, 300.0, 600.0), (100.0, 5_000.0, 20_000.0)],
            },
        ];
        let (svg, png) = (dir.join("plot.svg"), dir.join("plot.png"));
        latency_vs_load(&series, "test", &svg, &png).expect("plot");
        let text = std::fs::read_to_string(&svg).expect("svg");
        assert!(text.contains("fast p50") && text.contains("reference p99"));
        let bytes = std::fs::read(&png).expect("png");
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
        std::fs::remove_dir_all(&dir).ok();
    }
}
