//! The cluster's certificate authority. Nodes accept TCP connections only
//! over TLS with a client certificate it signed whose common name is the
//! role logging in, so whoever holds its key (the coordinator) can log in
//! to the nodes as any role without knowing any password, and a node's
//! links to other nodes log in with the certificate of the role they act
//! for. It also signs the nodes' and the coordinator's server certificates,
//! which clients and nodes verify against its certificate.

use anyhow::{Context, Result};
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

/// The certificate authority: its certificate, and the key it signs with.
pub struct ClusterCa {
    certificate: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate the authority signed, and its private key, both as PEM.
pub struct Issued {
    pub certificate_pem: String,
    pub key_pem: String,
}

const CA_NAME: &str = "Tessera cluster CA";

impl ClusterCa {
    /// A new authority, for a new cluster.
    pub fn create() -> Result<ClusterCa> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(CA_NAME);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let certificate = params.self_signed(&key)?;
        Ok(ClusterCa { certificate, key })
    }

    /// The authority a cluster was made with, from its certificate and key
    /// (PEM files).
    pub fn load(certificate_file: &std::path::Path, key_file: &std::path::Path) -> Result<ClusterCa> {
        let certificate_pem = std::fs::read_to_string(certificate_file)
            .with_context(|| format!("could not read the cluster CA certificate {}", certificate_file.display()))?;
        let key_pem = std::fs::read_to_string(key_file).with_context(|| format!("could not read the cluster CA key {}", key_file.display()))?;
        let key = KeyPair::from_pem(&key_pem).with_context(|| format!("{} holds no private key", key_file.display()))?;
        let params = CertificateParams::from_ca_cert_pem(&certificate_pem)
            .with_context(|| format!("{} holds no CA certificate", certificate_file.display()))?;
        // Signing again with the same name and key yields an issuer that
        // certificates chain to just as to the original.
        let certificate = params.self_signed(&key)?;
        Ok(ClusterCa { certificate, key })
    }

    pub fn certificate_pem(&self) -> String {
        self.certificate.pem()
    }

    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A server's certificate for the host names and addresses `names`.
    pub fn server_certificate(&self, names: &[String]) -> Result<Issued> {
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name = name(names.first().map(String::as_str).unwrap_or("tessera"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// The certificate a connection logging in as `role` presents.
    pub fn role_certificate(&self, role: &str) -> Result<Issued> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(role);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, mut params: CertificateParams) -> Result<Issued> {
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate()?;
        let certificate = params.signed_by(&key, &self.certificate, &self.key)?;
        Ok(Issued { certificate_pem: certificate.pem(), key_pem: key.serialize_pem() })
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// The common name of a certificate (DER): the role a client certificate
/// logs in as.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let name = certificate.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_certificates_name_their_role_and_outlive_a_reload_of_the_authority() {
        let ca = ClusterCa::create().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        std::fs::write(&cert, ca.certificate_pem()).unwrap();
        std::fs::write(&key, ca.key_pem()).unwrap();
        let reloaded = ClusterCa::load(&cert, &key).unwrap();
        let issued = reloaded.role_certificate("app user").unwrap();
        let der = rustls::pki_types::CertificateDer::from(pem_der(&issued.certificate_pem));
        assert_eq!(common_name(&der).as_deref(), Some("app user"));
        // The reloaded authority's certificates verify against the original one.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(rustls::pki_types::CertificateDer::from(pem_der(&ca.certificate_pem()))).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(std::sync::Arc::new(roots), provider).build().unwrap();
        verifier.verify_client_cert(&der, &[], rustls::pki_types::UnixTime::now()).expect("the role certificate verifies against the CA");
        let other = ClusterCa::create().unwrap().role_certificate("app user").unwrap();
        let other = rustls::pki_types::CertificateDer::from(pem_der(&other.certificate_pem));
        assert!(verifier.verify_client_cert(&other, &[], rustls::pki_types::UnixTime::now()).is_err());
    }

    fn pem_der(pem: &str) -> Vec<u8> {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
    }
}
