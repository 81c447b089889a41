//! JWT bearer tokens, as an OIDC provider or a workload identity platform issues them: signed
//! by a key of a JWKS file (re-read like the credentials file), from the configured issuer,
//! for the configured audience, unexpired, naming the caller in one claim and its role in
//! another.
//!
//! The algorithm comes from the key, never from the token: a token is checked only with the
//! algorithm its key declares (or its key type implies), so `alg: none` and an RSA key
//! presented as an HMAC secret are refused. A JWKS holds public keys only: a symmetric
//! (`oct`) key in it is refused when the file is read.

use std::{path::PathBuf, str::FromStr, time::Duration};

use jsonwebtoken::{
    Algorithm, DecodingKey, Validation, decode, decode_header,
    jwk::{AlgorithmParameters, EllipticCurve, JwkSet},
};

use super::Role;
use inventory_core::domain::Tenant;

/// How signed tokens are checked (`JWT_*` settings).
#[derive(Clone, Debug)]
pub struct JwtSettings {
    /// The signing keys, a JWKS document (`{"keys": [...]}`) as the issuer publishes it.
    pub jwks_file: PathBuf,
    /// The `iss` every token must carry.
    pub issuer: String,
    /// An `aud` every token must carry (one of its values).
    pub audience: String,
    /// The claim that names the caller (`sub` by default).
    pub caller_claim: String,
    /// The claim that carries the role (`reader`, `reserver`, `watcher` or `admin`) of a
    /// subject no credentials line maps. `operator` is refused there: only a line makes a
    /// caller an operator.
    pub role_claim: String,
    /// The claim that names the caller's tenant; a token without it is tenant `default`'s.
    pub tenant_claim: String,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
}

/// The keys of one JWKS file, with the settings they are checked under.
#[derive(Clone)]
pub(super) struct Verifier {
    settings: JwtSettings,
    keys: Vec<Key>,
}

#[derive(Clone)]
struct Key {
    id: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// What a verified token says: the caller claim, the role claim (or why it names no role),
/// the tenant claim.
pub(super) type Verified = (String, Result<Role, String>, Option<Tenant>);

/// A compact JWS: three base64url parts.
pub(super) fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3
}

impl Verifier {
    /// Reads a JWKS document; every unusable key is reported, by position and `kid`.
    pub(super) fn parse(settings: &JwtSettings, text: &str) -> Result<Self, Vec<String>> {
        let file = settings.jwks_file.display();
        let set: JwkSet = serde_json::from_str(text).map_err(|error| {
            vec![format!(
                "JWT_JWKS_FILE {file}: not a JWKS document: {error}"
            )]
        })?;
        let mut keys = Vec::new();
        let mut problems = Vec::new();
        for (index, jwk) in set.keys.iter().enumerate() {
            let name = match &jwk.common.key_id {
                Some(id) => format!("JWT_JWKS_FILE {file}: key {index} ({id})"),
                None => format!("JWT_JWKS_FILE {file}: key {index}"),
            };
            // An encryption key published beside the signing keys signs nothing here.
            if jwk
                .common
                .public_key_use
                .as_ref()
                .is_some_and(|usage| *usage != jsonwebtoken::jwk::PublicKeyUse::Signature)
            {
                continue;
            }
            let implied = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
                AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                    EllipticCurve::P256 => Some(Algorithm::ES256),
                    EllipticCurve::P384 => Some(Algorithm::ES384),
                    _ => None,
                },
                AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
                AlgorithmParameters::OctetKey(_) => {
                    problems.push(format!(
                        "{name}: a symmetric key has no place in a JWKS; use a signing key pair"
                    ));
                    continue;
                }
                _ => None,
            };
            let declared = jwk
                .common
                .key_algorithm
                .map(|algorithm| Algorithm::from_str(&format!("{algorithm:?}")));
            let algorithm = match (declared, implied) {
                (Some(Ok(algorithm)), Some(implied)) if algorithm.family() != implied.family() => {
                    problems.push(format!("{name}: its algorithm does not fit its key type"));
                    continue;
                }
                (Some(Ok(algorithm)), _) => algorithm,
                (None, Some(algorithm)) => algorithm,
                _ => {
                    problems.push(format!(
                        "{name}: its algorithm is not one tokens are signed with"
                    ));
                    continue;
                }
            };
            match DecodingKey::from_jwk(jwk) {
                Ok(key) => keys.push(Key {
                    id: jwk.common.key_id.clone(),
                    algorithm,
                    key,
                }),
                Err(error) => problems.push(format!("{name}: {error}")),
            }
        }
        if problems.is_empty() && keys.is_empty() {
            problems.push(format!("JWT_JWKS_FILE {file}: holds no keys"));
        }
        if problems.is_empty() {
            Ok(Self {
                settings: settings.clone(),
                keys,
            })
        } else {
            Err(problems)
        }
    }

    /// The caller's name, role (or why its role claim names none: only a subject no line
    /// maps needs one) and tenant, if `token` is signed by one of the keys and its claims
    /// hold; otherwise why not (never the token itself).
    pub(super) fn verify(&self, token: &str) -> Result<Verified, String> {
        let header =
            decode_header(token).map_err(|error| format!("unreadable header ({error})"))?;
        let candidates = self.keys.iter().filter(|key| {
            key.algorithm == header.alg
                && match (&header.kid, &key.id) {
                    (Some(wanted), Some(id)) => wanted == id,
                    (Some(_), None) => false,
                    (None, _) => true,
                }
        });
        let mut last = String::from("no key of the JWKS matches its kid and algorithm");
        for key in candidates {
            let mut validation = Validation::new(key.algorithm);
            validation.set_issuer(&[&self.settings.issuer]);
            validation.set_audience(&[&self.settings.audience]);
            validation.set_required_spec_claims(&["exp", "iss", "aud"]);
            validation.validate_nbf = true;
            validation.leeway = self.settings.leeway.as_secs();
            match decode::<serde_json::Map<String, serde_json::Value>>(token, &key.key, &validation)
            {
                Ok(data) => return self.principal(&data.claims),
                Err(error) => last = error.to_string(),
            }
        }
        Err(last)
    }

    fn principal(
        &self,
        claims: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Verified, String> {
        let text = |claim: &str| {
            claims
                .get(claim)
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| format!("claim '{claim}' is missing or not a string"))
        };
        let caller = text(&self.settings.caller_claim)?;
        let role = text(&self.settings.role_claim).and_then(|role| {
            Role::parse(role).ok_or_else(|| {
                format!(
                    "claim '{}' must be reader, reserver, watcher or admin",
                    self.settings.role_claim
                )
            })
        });
        // Absent: the caller's tenant is its credentials line's, or `default`.
        let tenant =
            match claims.get(&self.settings.tenant_claim) {
                None => None,
                Some(_) => Some(Tenant::parse(text(&self.settings.tenant_claim)?).map_err(
                    |problem| format!("claim '{}' {problem}", self.settings.tenant_claim),
                )?),
            };
        Ok((caller.to_owned(), role, tenant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, jwk::Jwk};

    fn jwk(kid: &str, usage: Option<&str>) -> serde_json::Value {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let key = EncodingKey::from_ec_der(&pair.serialize_der());
        let mut jwk =
            serde_json::to_value(Jwk::from_encoding_key(&key, Algorithm::ES256).unwrap()).unwrap();
        jwk["kid"] = kid.into();
        if let Some(usage) = usage {
            jwk["use"] = usage.into();
        }
        jwk
    }

    fn settings() -> JwtSettings {
        JwtSettings {
            jwks_file: "jwks.json".into(),
            issuer: "https://id.example".into(),
            audience: "inventory".into(),
            caller_claim: "sub".into(),
            role_claim: "inventory_role".into(),
            tenant_claim: "inventory_tenant".into(),
            leeway: Duration::from_secs(5),
        }
    }

    #[test]
    fn only_signing_keys_are_taken_and_symmetric_ones_are_refused() {
        let text = serde_json::json!({ "keys": [
            jwk("signs", Some("sig")),
            jwk("encrypts", Some("enc")),
            jwk("unsaid", None),
        ]})
        .to_string();
        let verifier = Verifier::parse(&settings(), &text).unwrap();
        let ids: Vec<_> = verifier
            .keys
            .iter()
            .map(|k| k.id.clone().unwrap())
            .collect();
        assert_eq!(ids, ["signs", "unsaid"]);

        let symmetric = r#"{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}"#;
        let problems = Verifier::parse(&settings(), symmetric).err().unwrap();
        assert!(problems[0].contains("symmetric"), "{problems:?}");
        let only_enc = serde_json::json!({ "keys": [jwk("encrypts", Some("enc"))] }).to_string();
        let problems = Verifier::parse(&settings(), &only_enc).err().unwrap();
        assert!(problems[0].contains("holds no keys"), "{problems:?}");
    }

    #[test]
    fn the_tenant_claim_names_the_callers_tenant_and_may_be_absent() {
        let text = serde_json::json!({ "keys": [jwk("signs", Some("sig"))] }).to_string();
        let verifier = Verifier::parse(&settings(), &text).unwrap();
        let claims = |tenant: Option<serde_json::Value>| {
            let mut claims = serde_json::json!({ "sub": "checkout", "inventory_role": "reserver" });
            if let Some(tenant) = tenant {
                claims["inventory_tenant"] = tenant;
            }
            claims.as_object().unwrap().clone()
        };
        let (_, _, tenant) = verifier.principal(&claims(None)).unwrap();
        assert_eq!(tenant, None);
        let (_, _, tenant) = verifier.principal(&claims(Some("outlet".into()))).unwrap();
        assert_eq!(tenant.unwrap().as_str(), "outlet");
        for bad in [serde_json::json!("Outlet Store"), serde_json::json!(7)] {
            let problem = verifier.principal(&claims(Some(bad))).unwrap_err();
            assert!(problem.contains("inventory_tenant"), "{problem}");
        }
    }
}
