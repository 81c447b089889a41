//! TLS to PostgreSQL, as libpq documents it.
//!
//! `DATABASE_URL` takes libpq's `sslmode` (`disable`, `prefer`, `require`, `verify-ca`,
//! `verify-full`), `sslrootcert` (a PEM file, or `system` for the operating system's roots),
//! and `sslcert` / `sslkey` (a client certificate). tokio-postgres itself knows only
//! `disable`, `prefer` and `require` and checks no certificate, so these settings are taken
//! out of the URL here and turned into a rustls client configuration:
//!
//! | sslmode | encrypted | certificate chain checked | host name checked |
//! |---|---|---|---|
//! | `disable` | never | - | - |
//! | `prefer` (default) | if the server offers it | only with `sslrootcert` | no |
//! | `require` | always | only with `sslrootcert` | no |
//! | `verify-ca` | always | yes | no |
//! | `verify-full` | always | yes | yes |
//!
//! Unlike libpq, nothing is read from `~/.postgresql/`: `verify-ca` and `verify-full` need an
//! explicit `sslrootcert`, so what is trusted is always visible in the configuration.

use std::{fmt, path::Path, sync::Arc};

use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature},
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
};
use tokio_postgres::config::SslMode as DriverSslMode;
pub use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(raw: &str) -> Result<Self, String> {
        Ok(match raw {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            "allow" => {
                return Err(
                    "sslmode=allow is not supported: use prefer, or require for encryption".into(),
                );
            }
            other => {
                return Err(format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                ));
            }
        })
    }

    /// What the driver is told: whether to ask for TLS and whether to insist.
    pub(crate) fn driver(self) -> DriverSslMode {
        match self {
            Self::Disable => DriverSslMode::Disable,
            Self::Prefer => DriverSslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => DriverSslMode::Require,
        }
    }
}

/// The `ssl*` settings found in a connection string.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SslParams {
    pub mode: Option<String>,
    pub rootcert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

impl SslParams {
    /// Takes `key`'s value if it is one of ours; `false` leaves it to the driver.
    fn take(&mut self, key: &str, value: String) -> bool {
        let slot = match key {
            "sslmode" => &mut self.mode,
            "sslrootcert" => &mut self.rootcert,
            "sslcert" => &mut self.cert,
            "sslkey" => &mut self.key,
            _ => return false,
        };
        *slot = Some(value);
        true
    }
}

/// Splits the `ssl*` settings off a `postgres://` URL or a `key=value` string; the rest is
/// returned as it was written, for the driver to parse.
pub(crate) fn split_ssl_params(raw: &str) -> Result<(String, SslParams), String> {
    let mut params = SslParams::default();
    if let Some(scheme_end) = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|scheme| raw.starts_with(scheme).then_some(scheme.len()))
    {
        // As the driver reads it: the credentials run to the first `@` (a password may hold a
        // raw `?`), and the query starts at the first `?` after them.
        let authority = raw[scheme_end..]
            .find('@')
            .map_or(scheme_end, |at| scheme_end + at + 1);
        let Some(question) = raw[authority..].find('?').map(|q| authority + q) else {
            return Ok((raw.to_owned(), params));
        };
        let (base, query) = (&raw[..question], &raw[question + 1..]);
        let mut kept = Vec::new();
        for part in query.split('&').filter(|part| !part.is_empty()) {
            let (key, value) = part.split_once('=').unwrap_or((part, ""));
            if !params.take(&percent_decode(key)?, percent_decode(value)?) {
                kept.push(part);
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, params));
    }
    let mut kept = Vec::new();
    let mut rest = raw.trim_start();
    while !rest.is_empty() {
        let (key, value, raw_pair, after) = next_pair(rest)?;
        if !params.take(key, value) {
            kept.push(raw_pair);
        }
        rest = after.trim_start();
    }
    Ok((kept.join(" "), params))
}

/// One `key = value` pair of a libpq key/value string: the key, the unquoted value, the pair
/// as written, and what follows it.
fn next_pair(text: &str) -> Result<(&str, String, &str, &str), String> {
    // Errors never quote the text: it may hold a password.
    let equals = text
        .find('=')
        .ok_or_else(|| "a setting without '=' (expected key=value)".to_owned())?;
    let key = text[..equals].trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err("a setting that is not key=value".to_owned());
    }
    let after_equals = &text[equals + 1..];
    let value_start = after_equals.len() - after_equals.trim_start().len();
    let mut chars = after_equals[value_start..].char_indices();
    let mut value = String::new();
    let end;
    match chars.clone().next() {
        Some((_, '\'')) => {
            chars.next();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, c)) => value.push(c),
                        None => return Err(format!("unterminated quote after {key}=")),
                    },
                    Some((i, '\'')) => {
                        end = i + 1;
                        break;
                    }
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("unterminated quote after {key}=")),
                }
            }
        }
        _ => loop {
            match chars.next() {
                Some((_, '\\')) => {
                    if let Some((_, c)) = chars.next() {
                        value.push(c);
                    }
                }
                Some((i, c)) if c.is_whitespace() => {
                    end = i;
                    break;
                }
                Some((_, c)) => value.push(c),
                None => {
                    end = after_equals.len() - value_start;
                    break;
                }
            }
        },
    }
    let consumed = equals + 1 + value_start + end;
    Ok((key, value, &text[..consumed], &text[consumed..]))
}

fn percent_decode(raw: &str) -> Result<String, String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = raw
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| "a % in the URL is not followed by two hex digits".to_owned())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the URL does not decode to UTF-8".into())
}

/// The TLS policy of every connection this process opens to PostgreSQL: the pool's, the
/// `LISTEN` connection's and `migrate`'s.
#[derive(Clone)]
pub struct PgTls {
    mode: SslMode,
    /// Whether the server's certificate chain is checked against `sslrootcert`.
    verifies_chain: bool,
    connector: MakeRustlsConnect,
}

impl fmt::Debug for PgTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTls")
            .field("mode", &self.mode)
            .field("verifies_chain", &self.verifies_chain)
            .finish_non_exhaustive()
    }
}

impl PgTls {
    /// Reads the files the settings name and builds the rustls configuration; every problem
    /// is reported now, at start-up, not at the first connection.
    pub(crate) fn from_params(params: &SslParams) -> Result<Self, String> {
        let mode = match &params.mode {
            Some(raw) => SslMode::parse(raw)?,
            None => SslMode::Prefer,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = match params.rootcert.as_deref() {
            Some(path) => Some(read_roots(path)?),
            None if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
                return Err(format!(
                    "sslmode={} needs sslrootcert=<CA file> (or sslrootcert=system)",
                    if mode == SslMode::VerifyCa {
                        "verify-ca"
                    } else {
                        "verify-full"
                    }
                ));
            }
            None => None,
        };
        let verifies_chain = roots.is_some() && mode != SslMode::Disable;
        let verifier: Arc<dyn ServerCertVerifier> = match roots {
            Some(roots) => {
                let webpki =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|error| format!("sslrootcert: {error}"))?;
                if mode == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(ChainOnly(webpki))
                }
            }
            None => Arc::new(EncryptOnly(provider.clone())),
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| error.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&params.cert, &params.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = read_certificates("sslcert", cert)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|error| format!("sslkey {key}: {error}"))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|error| format!("sslcert/sslkey: {error}"))?
            }
            _ => return Err("sslcert and sslkey must be given together".into()),
        };
        Ok(Self {
            mode,
            verifies_chain,
            connector: MakeRustlsConnect::new(config),
        })
    }

    pub fn mode(&self) -> SslMode {
        self.mode
    }

    /// The connector to hand to tokio-postgres.
    pub fn connector(&self) -> MakeRustlsConnect {
        self.connector.clone()
    }
}

fn read_certificates(setting: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("{setting} {path}: {error}"))?;
    if certificates.is_empty() {
        return Err(format!("{setting} {path}: no PEM certificate in the file"));
    }
    Ok(certificates)
}

fn read_roots(path: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    if path == "system" {
        let found = rustls_native_certs::load_native_certs();
        if let Some(error) = found.errors.first() {
            tracing::warn!(%error, "some system CA certificates could not be read");
        }
        roots.add_parsable_certificates(found.certs);
        if roots.is_empty() {
            return Err("sslrootcert=system: no CA certificate found on this system".into());
        }
        return Ok(roots);
    }
    if !Path::new(path).exists() {
        return Err(format!("sslrootcert {path}: no such file"));
    }
    for certificate in read_certificates("sslrootcert", path)? {
        roots
            .add(certificate)
            .map_err(|error| format!("sslrootcert {path}: {error}"))?;
    }
    Ok(roots)
}

/// `verify-ca` (and `require` with a root certificate): the chain must lead to a trusted root,
/// whatever host name the certificate is for.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::{CertificateError, Error};
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a root certificate: encrypted, not authenticated, as libpq
/// does. The handshake signature is still checked, so the session key belongs to whoever
/// holds the presented certificate.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
