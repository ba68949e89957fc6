//! The grammar of Kubernetes names a catalog or a task may carry into a cluster: label keys and values, DNS
//! subdomains (object names) and extended resource names. The catalog checks its node selectors and resources
//! with these, the Kubernetes backend its labels.

/// A valid label value: at most 63 characters, alphanumerics with `-_.` inside, or empty.
pub fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_label_name(v)
}

fn is_label_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// A valid label key: `[prefix/]name`, the prefix a DNS subdomain.
pub fn is_label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(k),
    }
}

/// A DNS-1123 subdomain (object names such as a PVC's): lowercase alphanumerics, `-` and `.`, at most 253.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
                && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// What is wrong with `name` as an extended resource a pod may request (`nvidia.com/gpu`, `amd.com/gpu`,
/// `nvidia.com/mig-1g.10gb`, `rdma/hca_shared_devices_a`, `vpc.amazonaws.com/efa`): a qualified name with a
/// domain of its own, neither a native resource (`cpu`, `memory`, ...) nor in Kubernetes' own domains, which
/// the API server refuses as extended resources.
pub fn extended_resource_problem(name: &str) -> Option<String> {
    let Some((prefix, rest)) = name.split_once('/') else {
        return Some(format!(
            "{name:?} is not an extended resource: it needs a domain of its own (`vendor.com/{name}`)"
        ));
    };
    if !is_dns_subdomain(prefix) || !is_label_name(rest) {
        return Some(format!("{name:?} is not a valid resource name (`domain/name`, as a label key)"));
    }
    if prefix == "kubernetes.io" || prefix.ends_with(".kubernetes.io") || prefix == "requests" {
        return Some(format!("{name:?} is in a domain Kubernetes keeps for its own resources"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_the_api_server_takes_them() {
        assert!(is_label_key("trainyard.dev/pool") && is_label_key("pool") && !is_label_key("a/b/c"));
        assert!(is_label_value("") && is_label_value("a-1.b_2") && !is_label_value("-a"));
        assert!(is_dns_subdomain("imagenet.v2") && !is_dns_subdomain("ImageNet"));
        for ok in ["nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-1g.10gb", "rdma/hca_shared_devices_a"] {
            assert_eq!(extended_resource_problem(ok), None, "{ok}");
        }
        for bad in ["gpu", "cpu", "kubernetes.io/gpu", "node.kubernetes.io/x", "Nvidia.com/gpu", "a.com/-x"] {
            assert!(extended_resource_problem(bad).is_some(), "{bad}");
        }
    }
}
