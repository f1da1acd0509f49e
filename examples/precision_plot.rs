//! A picture of the guarantee: the units admitted in the sliding window
//! (t − W, t], for every t, by four limiters of L = 100 per W = 60 s fed the
//! same traffic. A fixed-window counter (tower's `RateLimit`) and GCRA
//! (`governor`) both let nearly 2L through in some window of length W; this
//! crate's strict mode never lets more than L through, and admits beside an
//! exact sliding log (a timestamp per request), which it tracks within a
//! bucket's newest admission.
//!
//! The traffic repeats every two windows, on simulated time: one request opens
//! a window, a burst of L arrives just before the window's end and another at
//! its end, and demand then runs at twice the limit's rate until just before
//! the next window's end. The two bursts straddle the fixed window's reset;
//! the stream after them gets GCRA's steady refill on top of the full bucket
//! the first burst emptied. Strict mode, like the exact log, admits the first
//! burst and then waits for it to leave the window.
//!
//! Regenerate `docs/precision.svg` with `cargo run --example precision_plot`
//! (a first argument writes elsewhere). It also prints, for each limiter, the
//! most units admitted in any window of length W and the units admitted in
//! all, and fails if strict mode admitted more than L in some window, so
//! running it is a check too.

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::error::Error;
use std::num::NonZeroU32;
use std::time::Duration;
use tower_sliding_window::{Limiter, ManualClock, Policy};

/// Time in nanoseconds since the start of the simulation.
type Nanos = u64;

const LIMIT: u32 = 100;
const WINDOW: Duration = Duration::from_secs(60);
/// How far before a window's end the first burst of an episode arrives.
const EDGE: Duration = Duration::from_secs(1);
/// Episodes of traffic, two windows each, then two quiet windows so that
/// every curve is seen to drain.
const EPISODES: u64 = 3;
const PLOTTED_WINDOWS: u64 = 2 * EPISODES + 2;
/// Points on the time axis per window (plus every admission instant).
const GRID_PER_WINDOW: u64 = 200;

const OUTPUT: &str = "docs/precision.svg";

fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).expect("the simulation spans minutes")
}

/// Every request's arrival time, sorted. Per episode starting at `start`:
/// a lone request opens a window (tower's counter starts its period at the
/// first request after the last period, so without it the burst would); a burst of L just before that window ends
/// and a burst of L as it ends; then one request every W / 2L (twice the
/// limit's rate) until just before the next window ends.
fn traffic() -> Vec<Nanos> {
    let (window, edge) = (nanos(WINDOW), nanos(EDGE));
    let stream_gap = window / (2 * u64::from(LIMIT));
    let burst = |at: Nanos| std::iter::repeat_n(at, LIMIT as usize);
    let mut arrivals = Vec::new();
    for episode in 0..EPISODES {
        let start = 2 * episode * window;
        let boundary = start + window;
        arrivals.push(start);
        arrivals.extend(burst(boundary - edge));
        arrivals.extend(burst(boundary));
        let stream_end = boundary + window - edge;
        arrivals.extend(
            (1..)
                .map(|i| boundary + i * stream_gap)
                .take_while(|&t| t <= stream_end),
        );
    }
    arrivals
}

/// The arrival times a limiter admitted, asking it once per request in order.
fn admitted(arrivals: &[Nanos], mut admit: impl FnMut(Nanos) -> bool) -> Vec<Nanos> {
    arrivals.iter().copied().filter(|&t| admit(t)).collect()
}

/// tower's `RateLimit` (tower/src/limit/rate/service.rs): a counter of L
/// that resets on the first request at least W after its last reset. tower
/// holds a request over the limit back instead of refusing it; here it is
/// refused, as behind tower's `LoadShed`, so that only admissions are counted.
fn fixed_window() -> impl FnMut(Nanos) -> bool {
    let mut until: Nanos = 0;
    let mut left = 0;
    move |now| {
        if now >= until {
            until = now + nanos(WINDOW);
            left = LIMIT;
        }
        let admit = left > 0;
        left -= u32::from(admit);
        admit
    }
}

/// governor's GCRA with L per W and a burst of L, on a fake clock.
fn gcra() -> impl FnMut(Nanos) -> bool {
    let limit = NonZeroU32::new(LIMIT).expect("the limit is not zero");
    let quota = Quota::with_period(WINDOW / LIMIT)
        .expect("a non-zero period")
        .allow_burst(limit);
    let clock = FakeRelativeClock::default();
    let limiter = RateLimiter::direct_with_clock(quota, clock.clone());
    let mut clock_at: Nanos = 0;
    move |now| {
        // The fake clock only moves forwards, by a step.
        clock.advance(Duration::from_nanos(now - clock_at));
        clock_at = now;
        limiter.check().is_ok()
    }
}

/// An exact sliding log: every admission's instant, each counted for one
/// window.
fn exact_log() -> impl FnMut(Nanos) -> bool {
    let window = nanos(WINDOW);
    let mut log = std::collections::VecDeque::new();
    move |now| {
        while log.front().is_some_and(|&t: &Nanos| t + window <= now) {
            log.pop_front();
        }
        let fits = log.len() < LIMIT as usize;
        if fits {
            log.push_back(now);
        }
        fits
    }
}

/// This crate's limiter in strict mode (the default), on a manual clock.
fn strict() -> Result<impl FnMut(Nanos) -> bool, Box<dyn Error>> {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(Policy::per(LIMIT, WINDOW)?)
        .clock(clock.clone())
        .build()?;
    Ok(move |now| {
        clock.set(now);
        limiter.check(&"client").is_allowed()
    })
}

/// Units admitted in (t − W, t]; `admitted` is sorted.
fn in_window(admitted: &[Nanos], t: Nanos) -> usize {
    let after = |bound: Nanos| admitted.partition_point(|&a| a <= bound);
    after(t) - after(t.saturating_sub(nanos(WINDOW)))
}

/// The most units in any window of length W. The count only rises at an
/// admission, so its maximum is at one of them: this is exact.
fn max_in_window(admitted: &[Nanos]) -> usize {
    admitted
        .iter()
        .map(|&t| in_window(admitted, t))
        .max()
        .unwrap_or(0)
}

/// Where a curve is evaluated: a fine grid, plus every admission instant, so
/// that each peak is drawn at its true height.
fn sample_times(admitted: &[Nanos]) -> Vec<Nanos> {
    let step = nanos(WINDOW) / GRID_PER_WINDOW;
    let mut times: Vec<Nanos> = (0..=PLOTTED_WINDOWS * GRID_PER_WINDOW)
        .map(|i| i * step)
        .chain(admitted.iter().copied())
        .collect();
    times.sort_unstable();
    times.dedup();
    times
}

/// (time, units in the window ending then) for plotting.
fn curve(admitted: &[Nanos]) -> Vec<(Nanos, u32)> {
    let units = |t| u32::try_from(in_window(admitted, t)).expect("a few hundred units");
    sample_times(admitted)
        .into_iter()
        .map(|t| (t, units(t)))
        .collect()
}

struct Series {
    label: &'static str,
    colour: RGBColor,
    admitted: Vec<Nanos>,
}

/// Colours told apart with the common forms of colour blindness (Okabe–Ito).
const VERMILLION: RGBColor = RGBColor(213, 94, 0);
const BLUE: RGBColor = RGBColor(0, 114, 178);
const GREEN: RGBColor = RGBColor(0, 158, 115);
const GREY: RGBColor = RGBColor(120, 120, 120);

const SIZE: (u32, u32) = (1000, 580);
/// The strip under the chart that holds the legend: inside the chart it would
/// cover a peak wherever it went.
const LEGEND_HEIGHT: u32 = 36;

fn draw(path: &str, series: &[Series]) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(SIZE.1 - LEGEND_HEIGHT);
    let limit_style = BLACK.mix(0.7).stroke_width(1);
    draw_chart(&upper, series, limit_style)?;

    let mut entries: Vec<LegendEntry> = series
        .iter()
        .map(|s| LegendEntry {
            label: s.label.to_owned(),
            style: s.colour.stroke_width(3),
            dashed: false,
        })
        .collect();
    entries.push(LegendEntry {
        label: format!("limit L = {LIMIT}"),
        style: limit_style,
        dashed: true,
    });
    draw_legend(&lower, &entries)?;
    root.present()?;
    Ok(())
}

fn draw_chart(
    area: &DrawingArea<SVGBackend, Shift>,
    series: &[Series],
    limit_style: ShapeStyle,
) -> Result<(), Box<dyn Error>> {
    // Time stays in nanoseconds here (floats have no key points of our own
    // choosing in plotters), and is labelled in seconds.
    let window = nanos(WINDOW);
    let end = PLOTTED_WINDOWS * window;
    // Ticks and grid lines at the window boundaries, where the bursts are.
    let boundaries = (0..=PLOTTED_WINDOWS).map(|k| k * window).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "Units admitted in any window of length W (L = {LIMIT} per W = {} s)",
                WINDOW.as_secs()
            ),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        // A little room above the 2L that GCRA and the fixed window reach.
        .build_cartesian_2d((0..end).with_key_points(boundaries), 0..LIMIT * 22 / 10)?;
    chart
        .configure_mesh()
        .x_desc("time t (s)")
        .y_desc("units admitted in (t − W, t]")
        .y_labels(12)
        .x_label_formatter(&|&x| Duration::from_nanos(x).as_secs().to_string())
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        // One light line between ticks (the default fills the SVG with one a unit).
        .max_light_lines(1)
        .draw()?;

    for s in series {
        chart.draw_series(LineSeries::new(
            curve(&s.admitted),
            s.colour.stroke_width(2),
        ))?;
    }
    // The limit last, dashed, so it stays visible where strict mode runs on it.
    chart.draw_series(DashedLineSeries::new(
        [(0, LIMIT), (end, LIMIT)],
        6,
        4,
        limit_style,
    ))?;
    Ok(())
}

struct LegendEntry {
    label: String,
    style: ShapeStyle,
    dashed: bool,
}

/// One row of entries: a short line in the series' style, then its label.
fn draw_legend(
    area: &DrawingArea<SVGBackend, Shift>,
    entries: &[LegendEntry],
) -> Result<(), Box<dyn Error>> {
    let font =
        TextStyle::from(("sans-serif", 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let y = (LEGEND_HEIGHT / 2) as i32;
    let mut x = 72;
    for entry in entries {
        let style = entry.style;
        if entry.dashed {
            area.draw(&PathElement::new([(x, y), (x + 10, y)], style))?;
            area.draw(&PathElement::new([(x + 16, y), (x + 26, y)], style))?;
        } else {
            area.draw(&PathElement::new([(x, y), (x + 26, y)], style))?;
        }
        let label = entry.label.as_str();
        area.draw(&Text::new(label, (x + 34, y), font.clone()))?;
        let (width, _) = area.estimate_text_size(label, &font)?;
        x += 34 + width as i32 + 32;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| OUTPUT.to_owned());
    let arrivals = traffic();
    let series = [
        Series {
            label: "fixed window (tower RateLimit)",
            colour: VERMILLION,
            admitted: admitted(&arrivals, fixed_window()),
        },
        Series {
            label: "GCRA (governor)",
            colour: BLUE,
            admitted: admitted(&arrivals, gcra()),
        },
        Series {
            label: "exact sliding log",
            colour: GREY,
            admitted: admitted(&arrivals, exact_log()),
        },
        Series {
            label: "strict sliding window (this crate)",
            colour: GREEN,
            admitted: admitted(&arrivals, strict()?),
        },
    ];

    if let Some(dir) = std::path::Path::new(&path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    draw(&path, &series)?;

    println!(
        "{:<36} {:>20} {:>9}",
        format!("{} requests", arrivals.len()),
        format!("max in any {} s", WINDOW.as_secs()),
        "admitted"
    );
    for s in &series {
        let max = max_in_window(&s.admitted);
        println!("{:<36} {max:>20} {:>9}", s.label, s.admitted.len());
    }
    println!("{:<36} {LIMIT:>20}", "limit L");
    println!("wrote {path}");

    let strict_max = max_in_window(&series[3].admitted);
    if strict_max > LIMIT as usize {
        return Err(format!("strict mode admitted {strict_max} > {LIMIT} in one window").into());
    }
    Ok(())
}
