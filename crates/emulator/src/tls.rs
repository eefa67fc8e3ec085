//! The emulator's throwaway PKI: a CA and one leaf, both generated at start (ECDSA P-256),
//! served with rustls on the ring provider.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

/// DNS names and the address the leaf is valid for.
pub(crate) const LEAF_DNS_NAMES: [&str; 2] = ["localhost", "createos.test"];

pub(crate) struct Tls {
    pub ca_pem: String,
    pub acceptor: TlsAcceptor,
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("cannot set up TLS: {e}"))
}

/// A fresh CA (named after `instance`) and a leaf for `localhost`, `createos.test` and
/// `127.0.0.1`; ALPN offers `h2` (when `http2`) and `http/1.1`.
pub(crate) fn make(instance: &str, http2: bool) -> io::Result<Tls> {
    let ca_key = KeyPair::generate().map_err(other)?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, format!("createos-emulator CA {instance}"));
    ca.distinguished_name.push(DnType::OrganizationName, "createos-emulator (throwaway, local only)");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key).map_err(other)?;
    let issuer = Issuer::new(ca, ca_key);

    let leaf_key = KeyPair::generate().map_err(other)?;
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name.push(DnType::CommonName, "localhost");
    leaf.subject_alt_names = LEAF_DNS_NAMES
        .iter()
        .map(|n| Ok(SanType::DnsName((*n).try_into()?)))
        .collect::<Result<Vec<_>, rcgen::Error>>()
        .map_err(other)?;
    leaf.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(other)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(other)?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf_cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .map_err(other)?;
    cfg.alpn_protocols = if http2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    Ok(Tls { ca_pem: ca_cert.pem(), acceptor: TlsAcceptor::from(Arc::new(cfg)) })
}
