//! The current time as the services need it: monotonic for timers, wall clock for cookies and
//! Daytime.

use std::time::Duration;

/// The current time, given by the caller with every event. Services never read a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Now {
    /// Monotonic time from any origin (the session layer's clock); timers
    /// ([`ServerService::poll_timeout`](crate::ServerService::poll_timeout)) use it.
    pub monotonic: Duration,
    /// Wall-clock time since the Unix epoch: cookie expiry (pool elements of one pool compare
    /// it, so their clocks must roughly agree) and Daytime's text.
    pub unix: Duration,
}

impl Now {
    /// Wall-clock time used by [`from_monotonic`](Self::from_monotonic) for time zero:
    /// 2026-01-01T00:00:00Z.
    pub const VIRTUAL_EPOCH: Duration = Duration::from_secs(1_767_225_600);

    /// Both clocks given.
    pub fn new(monotonic: Duration, unix: Duration) -> Self {
        Self { monotonic, unix }
    }

    /// Virtual time for tests and simulations: the wall clock runs with the monotonic one from
    /// [`VIRTUAL_EPOCH`](Self::VIRTUAL_EPOCH).
    pub fn from_monotonic(monotonic: Duration) -> Self {
        Self {
            monotonic,
            unix: Self::VIRTUAL_EPOCH.saturating_add(monotonic),
        }
    }

    /// Both clocks moved on by `d`.
    pub fn advance(self, d: Duration) -> Self {
        Self {
            monotonic: self.monotonic.saturating_add(d),
            unix: self.unix.saturating_add(d),
        }
    }
}

const WEEKDAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Civil date from days since 1970-01-01 (proleptic Gregorian; H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// RSPLIB's Daytime line: `strftime("%A, %d-%B-%Y %H:%M:%S")` in the C locale, then `.` and six
/// digits of microseconds and a newline; for the wall-clock time `unix` shifted by
/// `utc_offset_secs` (the local time zone's offset; 0 = UTC).
pub(crate) fn daytime_line(unix: Duration, utc_offset_secs: i32) -> String {
    let secs = unix.as_secs() as i64 + i64::from(utc_offset_secs);
    let micros = unix.subsec_micros();
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{}, {:02}-{}-{} {:02}:{:02}:{:02}.{:06}\n",
        WEEKDAYS[days.rem_euclid(7) as usize],
        d,
        MONTHS[(m - 1) as usize],
        y,
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        micros
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daytime_matches_strftime() {
        // date -u -d @1767225600.012345 '+%A, %d-%B-%Y %H:%M:%S'
        assert_eq!(
            daytime_line(Duration::from_micros(1_767_225_600_012_345), 0),
            "Thursday, 01-January-2026 00:00:00.012345\n"
        );
        // 2024-02-29 23:59:59 UTC, a leap day, and one hour east of UTC.
        assert_eq!(
            daytime_line(Duration::from_secs(1_709_251_199), 0),
            "Thursday, 29-February-2024 23:59:59.000000\n"
        );
        assert_eq!(
            daytime_line(Duration::from_secs(1_709_251_199), 3600),
            "Friday, 01-March-2024 00:59:59.000000\n"
        );
        assert_eq!(
            daytime_line(Duration::ZERO, 0),
            "Thursday, 01-January-1970 00:00:00.000000\n"
        );
    }
}
