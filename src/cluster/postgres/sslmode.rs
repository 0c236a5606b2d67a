//! libpq's TLS parameters in a connection string, `sslmode` and `sslrootcert`, taken out of it
//! before tokio-postgres reads the rest: tokio-postgres knows only `disable`, `prefer` and
//! `require`, and no `sslrootcert` at all, so a URL copied from a managed server's console
//! (`?sslmode=verify-full&sslrootcert=...`) would not parse.
//!
//! Both forms tokio-postgres reads are handled the way it tells them apart: a URL when the
//! string starts with `postgres://` or `postgresql://`, `key=value` pairs otherwise.

use std::error::Error;
use std::fmt;
use std::path::PathBuf;

/// libpq's `sslmode`, with libpq's meanings (`allow` is not offered: it would try plain text
/// first, which no mode here does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Plain text only.
    Disable,
    /// TLS if the server offers it, plain text if it does not; the certificate is not checked.
    /// libpq's default, and so ours.
    Prefer,
    /// TLS or no connection; the certificate is not checked.
    Require,
    /// TLS, with a certificate that chains to a trusted root; any host name.
    VerifyCa,
    /// TLS, with a certificate that chains to a trusted root and names the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, BadTlsParameter> {
        match value {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            _ => Err(BadTlsParameter::UnknownSslMode {
                value: value.to_owned(),
            }),
        }
    }

    /// The value as the URL spells it, for messages.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: it decides only whether TLS is tried and whether plain
    /// text is then acceptable; the certificate checks are the TLS configuration's.
    pub(crate) fn wire(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Wire;
        match self {
            SslMode::Disable => Wire::Disable,
            SslMode::Prefer => Wire::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Wire::Require,
        }
    }
}

/// Where the roots for `verify-ca` and `verify-full` come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCertificates {
    /// The platform's store (`sslrootcert` absent, or `sslrootcert=system` as in libpq 16).
    System,
    /// A PEM file of one or more certificates (`sslrootcert=PATH`).
    File(PathBuf),
}

/// The TLS parameters of a connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsParameters {
    pub(crate) mode: SslMode,
    pub(crate) roots: RootCertificates,
}

/// Why the TLS parameters of a connection string were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BadTlsParameter {
    /// `sslmode` is none of libpq's values that this crate offers.
    UnknownSslMode {
        /// The value given.
        value: String,
    },
    /// A `'` opened a value in `key=value` pairs and nothing closed it.
    UnclosedQuote,
}

impl fmt::Display for BadTlsParameter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadTlsParameter::UnknownSslMode { value } => write!(
                f,
                "sslmode {value:?} is not one of disable, prefer, require, verify-ca, verify-full"
            ),
            BadTlsParameter::UnclosedQuote => f.write_str("a quoted value is not closed"),
        }
    }
}

impl Error for BadTlsParameter {}

/// Takes `sslmode` and `sslrootcert` out of `connection_string`: returns the rest, for
/// tokio-postgres, and the two parameters (libpq's defaults where absent; the last one wins
/// where repeated, as in libpq).
pub(crate) fn split(connection_string: &str) -> Result<(String, TlsParameters), BadTlsParameter> {
    let mut parameters = TlsParameters {
        mode: SslMode::Prefer,
        roots: RootCertificates::System,
    };
    let mut take = |key: &str, value: &str| -> Result<bool, BadTlsParameter> {
        match key {
            "sslmode" => parameters.mode = SslMode::parse(value)?,
            "sslrootcert" if value == "system" => parameters.roots = RootCertificates::System,
            "sslrootcert" => parameters.roots = RootCertificates::File(PathBuf::from(value)),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if connection_string.starts_with("postgres://")
        || connection_string.starts_with("postgresql://")
    {
        split_url(connection_string, &mut take)?
    } else {
        split_pairs(connection_string, &mut take)?
    };
    Ok((rest, parameters))
}

/// The URL without the query parameters `take` keeps (it says whether it kept one).
fn split_url(
    url: &str,
    take: &mut impl FnMut(&str, &str) -> Result<bool, BadTlsParameter>,
) -> Result<String, BadTlsParameter> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !take(&percent_decode(key), &percent_decode(value))? {
            kept.push(pair);
        }
    }
    if kept.is_empty() {
        Ok(base.to_owned())
    } else {
        Ok(format!("{base}?{}", kept.join("&")))
    }
}

/// `%XX` escapes decoded (a path in `sslrootcert` may be written with them); anything that is
/// not a valid escape is kept as it stands, and the result read as UTF-8 lossily.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| bytes.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        if let Some(byte) = escaped {
            decoded.push(byte);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// `key=value` pairs without the ones `take` keeps, written back with every value quoted.
/// Values are read as libpq reads them: bare up to whitespace, or in single quotes with `\`
/// escaping the next character; spaces may surround the `=`.
fn split_pairs(
    pairs: &str,
    take: &mut impl FnMut(&str, &str) -> Result<bool, BadTlsParameter>,
) -> Result<String, BadTlsParameter> {
    let mut kept = Vec::new();
    let mut rest = pairs.trim_start();
    while !rest.is_empty() {
        let key_end = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let key = &rest[..key_end];
        rest = rest[key_end..].trim_start();
        let Some(after_equals) = rest.strip_prefix('=') else {
            // Not a pair: left for tokio-postgres to refuse with its own message.
            return Ok(pairs.to_owned());
        };
        rest = after_equals.trim_start();
        let mut value = String::new();
        if let Some(quoted) = rest.strip_prefix('\'') {
            let mut chars = quoted.char_indices();
            let mut closed_at = None;
            while let Some((at, c)) = chars.next() {
                match c {
                    '\'' => {
                        closed_at = Some(at + 1);
                        break;
                    }
                    '\\' => value.extend(chars.next().map(|(_, escaped)| escaped)),
                    c => value.push(c),
                }
            }
            let closed_at = closed_at.ok_or(BadTlsParameter::UnclosedQuote)?;
            rest = &quoted[closed_at..];
        } else {
            let value_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            value.push_str(&rest[..value_end]);
            rest = &rest[value_end..];
        }
        rest = rest.trim_start();
        if !take(key, &value)? {
            let escaped = value.replace('\\', "\\\\").replace('\'', "\\'");
            kept.push(format!("{key}='{escaped}'"));
        }
    }
    Ok(kept.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_ok(connection_string: &str) -> (String, SslMode, RootCertificates) {
        let (rest, parameters) = split(connection_string).expect("splits");
        (rest, parameters.mode, parameters.roots)
    }

    #[test]
    fn a_url_loses_its_tls_parameters_and_keeps_the_others() {
        let (rest, mode, roots) = split_ok(
            "postgres://me:pw@db:5433/test?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        );
        assert_eq!(rest, "postgres://me:pw@db:5433/test?application_name=x");
        assert_eq!(mode, SslMode::VerifyFull);
        assert_eq!(roots, RootCertificates::File(PathBuf::from("/tmp/ca.pem")));
        let (rest, mode, roots) = split_ok("postgresql://db/test?sslmode=verify-ca");
        assert_eq!(rest, "postgresql://db/test");
        assert_eq!(mode, SslMode::VerifyCa);
        assert_eq!(roots, RootCertificates::System);
    }

    #[test]
    fn without_sslmode_the_mode_is_prefer_as_in_libpq() {
        let (rest, mode, _) = split_ok("postgres://db/test");
        assert_eq!(
            (rest.as_str(), mode),
            ("postgres://db/test", SslMode::Prefer)
        );
        let (_, mode, _) = split_ok("host=db dbname=test");
        assert_eq!(mode, SslMode::Prefer);
    }

    #[test]
    fn key_value_pairs_lose_their_tls_parameters_and_keep_the_others_quoted() {
        let (rest, mode, roots) =
            split_ok("host=db sslmode = require  password='it\\'s x' sslrootcert='/a b/ca.pem'");
        assert_eq!(mode, SslMode::Require);
        assert_eq!(roots, RootCertificates::File(PathBuf::from("/a b/ca.pem")));
        assert_eq!(rest, "host='db' password='it\\'s x'");
        let (rest, _, roots) = split_ok("host=db user=me sslrootcert=system");
        assert_eq!(rest, "host='db' user='me'");
        assert_eq!(roots, RootCertificates::System);
        let parsed: Result<tokio_postgres::Config, _> =
            split_ok("host=db password='a\\'b c' sslmode=disable")
                .0
                .parse();
        assert_eq!(
            parsed
                .ok()
                .and_then(|config| config.get_password().map(<[u8]>::to_vec)),
            Some(b"a'b c".to_vec())
        );
    }

    #[test]
    fn an_unknown_sslmode_or_an_open_quote_is_refused() {
        assert_eq!(
            split("postgres://db/test?sslmode=allow").err(),
            Some(BadTlsParameter::UnknownSslMode {
                value: "allow".to_owned()
            })
        );
        assert_eq!(
            split("host=db password='open").err(),
            Some(BadTlsParameter::UnclosedQuote)
        );
    }
}
