//! [`LeaseOwner`]: the name a lease store writes in every row it holds, `host:pid:random`, so
//! that a row read by hand or in a [`ClusterSnapshot`](crate::ClusterSnapshot) says which
//! process holds it.
//!
//! The name is written in the `owner` column of every lease row and every part lease, and in
//! the store's connection names (`keyed-locks statements {owner}`), which PostgreSQL cuts at
//! 63 bytes: so it is bounded, [`LeaseOwner::MAX_LEN`] bytes, and a long host name is cut to
//! fit. The random part is what makes it unique: two stores of one process (and two processes
//! of one host whose pids repeat, such as containers that all run as pid 1 on hosts whose
//! names were cut alike) differ in it.

use std::fmt;

/// The name of a lease owner, one per lease store (so per [`ClusterRegistry`]), as the lease
/// table's `owner` column holds it: `host:pid:random`.
///
/// - `host` is the machine's short host name (up to its first dot), in ASCII letters, digits,
///   `-` and `_` (anything else becomes `-`). A name too long for the bound keeps its end,
///   after a `~`: container and pod names put what tells replicas apart at their end
///   (`payments-api-7d9f8b6c4-x2x9z` becomes `~-api-7d9f8b6c4-x2x9z` for pid 1).
/// - `pid` is the process id, in decimal.
/// - `random` is 64 random bits drawn at connect, in 16 lowercase hex digits.
///
/// The whole name is at most [`LeaseOwner::MAX_LEN`] bytes.
///
/// # Examples
///
/// ```
/// use keyed_locks::LeaseOwner;
///
/// let owner = LeaseOwner::parse("web-3:4242:00c0ffee00c0ffee").expect("an owner name");
/// assert_eq!((owner.host(), owner.pid()), ("web-3", 4242));
/// assert_eq!(owner.to_string(), "web-3:4242:00c0ffee00c0ffee");
/// assert!(LeaseOwner::parse("4242-00c0ffee00c0ffee").is_none());
/// ```
///
/// [`ClusterRegistry`]: crate::ClusterRegistry
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LeaseOwner {
    host: String,
    pid: u32,
    random: u64,
}

/// The random part's digits: 64 bits in hex.
const RANDOM_DIGITS: usize = 16;

/// What marks a host name that was cut to fit.
const CUT_MARK: char = '~';

impl LeaseOwner {
    /// The longest owner name, in bytes: with `keyed-locks statements ` (23 bytes) before
    /// it, a connection's name stays within PostgreSQL's 63 bytes, beyond which the server
    /// cuts it. It leaves a host name at least 12 bytes (with a 10-digit pid), 21 with pid 1.
    pub const MAX_LEN: usize = 40;

    /// The owner name of a store of this process: this host, this process, `random`.
    pub(crate) fn of_this_process(random: u64) -> Self {
        LeaseOwner::new(&host_name(), std::process::id(), random)
    }

    /// `host` made fit for a name (short, plain characters, cut to the bound), `pid` and
    /// `random`.
    pub(crate) fn new(host: &str, pid: u32, random: u64) -> Self {
        let short = host.trim().split('.').next().unwrap_or_default();
        let mut plain: String = short
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        if plain.is_empty() {
            plain = "unknown".to_owned();
        }
        // The two colons, the pid's digits and the random part take the rest.
        let room = Self::MAX_LEN - 2 - RANDOM_DIGITS - decimal_digits(pid);
        if plain.len() > room {
            // ASCII only by now, so any byte index is a character boundary.
            let kept = &plain[plain.len() - (room - CUT_MARK.len_utf8())..];
            plain = format!("{CUT_MARK}{kept}");
        }
        let owner = LeaseOwner {
            host: plain,
            pid,
            random,
        };
        debug_assert!(owner.to_string().len() <= Self::MAX_LEN, "{owner}");
        owner
    }

    /// The owner named by `name`, if it is a name in this format (as [`Display`](fmt::Display)
    /// writes it, at most [`MAX_LEN`](Self::MAX_LEN) bytes); `None` for anything else: an
    /// owner written by an older version of the crate (`pid-random`), a row edited by hand.
    /// Never panics.
    pub fn parse(name: &str) -> Option<Self> {
        if name.len() > Self::MAX_LEN {
            return None;
        }
        // From the right: the host is the only part that could hold a colon, and never does.
        let mut parts = name.rsplitn(3, ':');
        let (random, pid, host) = (parts.next()?, parts.next()?, parts.next()?);
        let host_is_plain = |host: &str| {
            let body = host.strip_prefix(CUT_MARK).unwrap_or(host);
            !body.is_empty()
                && body
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        let digits = |text: &str, hex: bool| {
            !text.is_empty()
                && text.chars().all(|c| {
                    if hex {
                        c.is_ascii_digit() || ('a'..='f').contains(&c)
                    } else {
                        c.is_ascii_digit()
                    }
                })
        };
        if !host_is_plain(host)
            || !digits(pid, false)
            || random.len() != RANDOM_DIGITS
            || !digits(random, true)
        {
            return None;
        }
        Some(LeaseOwner {
            host: host.to_owned(),
            pid: pid.parse().ok()?,
            random: u64::from_str_radix(random, 16).ok()?,
        })
    }

    /// The host the owner runs on (its short name, perhaps cut: see the type's docs).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The owner's process id on its host.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The random part, which tells apart two stores of one process.
    pub fn random(&self) -> u64 {
        self.random
    }
}

impl fmt::Display for LeaseOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{:016x}", self.host, self.pid, self.random)
    }
}

/// The decimal digits of `number`.
fn decimal_digits(number: u32) -> usize {
    number.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// This machine's host name, without a dependency and without `unsafe`: the kernel's (Linux),
/// else the `HOSTNAME` or `COMPUTERNAME` (Windows) variable, else `/etc/hostname`, else
/// `unknown`. Read once per store, at connect.
fn host_name() -> String {
    let from_file = |path: &str| std::fs::read_to_string(path).ok();
    let from_env = |name: &str| std::env::var(name).ok();
    [
        from_file("/proc/sys/kernel/hostname"),
        from_env("HOSTNAME"),
        from_env("COMPUTERNAME"),
        from_file("/etc/hostname"),
    ]
    .into_iter()
    .flatten()
    .map(|name| name.trim().to_owned())
    .find(|name| !name.is_empty())
    .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_reads_back_as_written() {
        let owner = LeaseOwner::new("web-3", 4242, 0x00c0_ffee_00c0_ffee);
        assert_eq!(owner.to_string(), "web-3:4242:00c0ffee00c0ffee");
        assert_eq!(LeaseOwner::parse(&owner.to_string()), Some(owner.clone()));
        assert_eq!(
            (owner.host(), owner.pid(), owner.random()),
            ("web-3", 4242, 0x00c0_ffee_00c0_ffee)
        );
    }

    #[test]
    fn a_host_name_is_shortened_and_made_plain() {
        let owner = LeaseOwner::new(" db1.eu-west.example.com\n", 7, 1);
        assert_eq!(owner.host(), "db1");
        assert_eq!(LeaseOwner::new("my host:1", 7, 1).host(), "my-host-1");
        assert_eq!(LeaseOwner::new("", 7, 1).host(), "unknown");
        assert_eq!(LeaseOwner::new(".", 7, 1).host(), "unknown");
    }

    #[test]
    fn a_long_host_name_keeps_its_end_within_the_bound() {
        let pod = "payments-api-7d9f8b6c4-x2x9z";
        let owner = LeaseOwner::new(pod, 1, u64::MAX);
        assert_eq!(owner.host(), "~-api-7d9f8b6c4-x2x9z");
        assert_eq!(owner.to_string().len(), LeaseOwner::MAX_LEN);
        assert_eq!(LeaseOwner::parse(&owner.to_string()), Some(owner));
        // The longest pid leaves the least room, and the bound still holds.
        let long = "a".repeat(300);
        let owner = LeaseOwner::new(&long, u32::MAX, 0);
        assert_eq!(owner.to_string().len(), LeaseOwner::MAX_LEN);
        assert_eq!(owner.host().len(), 12);
        assert_eq!(LeaseOwner::parse(&owner.to_string()), Some(owner));
        // A name that fits is not cut.
        let fits = "h".repeat(21);
        assert_eq!(LeaseOwner::new(&fits, 1, 0).host(), fits);
    }

    #[test]
    fn this_process_is_named_with_its_pid() {
        let owner = LeaseOwner::of_this_process(5);
        assert_eq!(owner.pid(), std::process::id());
        assert!(!owner.host().is_empty());
        assert_eq!(LeaseOwner::parse(&owner.to_string()), Some(owner));
    }

    #[test]
    fn anything_else_is_not_an_owner_name() {
        for garbage in [
            "",
            ":",
            "::",
            "h::0000000000000001",
            ":1:0000000000000001",
            "h:1:",
            "h:1:1",
            "h:1:00000000000000001",
            "h:1:000000000000000g",
            "h:1:000000000000000A",
            "h:-1:0000000000000001",
            "h:4294967296:0000000000000001",
            "h:+1:0000000000000001",
            "h.x:1:0000000000000001",
            "a:b:1:0000000000000001",
            "~:1:0000000000000001",
            "héllo:1:0000000000000001",
            "4242-00c0ffee00c0ffee",
            "memory-1",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:1:0000000000000001",
        ] {
            assert_eq!(LeaseOwner::parse(garbage), None, "{garbage:?}");
        }
    }
}
