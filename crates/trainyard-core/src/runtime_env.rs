//! Checks a Ray runtime env given as YAML text, field by field, the way Ray reads it: known fields with
//! their types, the combinations Ray refuses, and unknown fields (plugins) as warnings.

use crate::decode::type_name;
use crate::problem::{Code, Report, field, index, key};
use crate::yaml::yaml_to_value;
use serde_json::Value;

/// Fields Ray's runtime env understands, with what each holds.
const FIELDS: &[(&str, &str)] = &[
    ("working_dir", "a local directory or a URI of a zip file"),
    ("py_modules", "a list of local directories, wheels or URIs"),
    ("py_executable", "the Python executable to run workers with"),
    ("excludes", "a list of paths or patterns to leave out of working_dir and py_modules"),
    ("pip", "a list of requirements, a requirements.txt path, or {packages, pip_check, pip_version}"),
    (
        "uv",
        "a list of requirements, a requirements.txt path, or {packages, uv_version, uv_check, uv_pip_install_options}",
    ),
    ("conda", "an environment name, an environment.yml path, or an environment mapping"),
    ("env_vars", "a mapping of variable names to string values"),
    ("container", "a container mapping (deprecated; use image_uri)"),
    ("image_uri", "an image to run the workers in"),
    ("config", "{setup_timeout_seconds, eager_install}"),
    ("java_jars", "a list of jar paths or URIs"),
    ("nsight", "\"default\" or a mapping of nsys options"),
    ("worker_process_setup_hook", "a module.function to call in every worker"),
    ("mpi", "an MPI mapping"),
];

/// Checks `text` found at `path`, adding problems to `r`. Empty text means no runtime env.
pub fn check(r: &mut Report, path: &str, text: &str) {
    if text.trim().is_empty() {
        return;
    }
    let value = match yaml_to_value(text) {
        Ok(v) => v,
        Err(e) => {
            r.error(path, Code::Syntax, format!("is not valid YAML: {e}"));
            return;
        }
    };
    let Value::Object(map) = &value else {
        if !value.is_null() {
            r.error(
                path,
                Code::WrongType,
                format!("must be a YAML mapping of runtime env fields, found {}", type_name(&value)),
            );
        }
        return;
    };
    for (k, v) in map {
        let p = key(path, k);
        match k.as_str() {
            "working_dir" | "py_executable" | "image_uri" | "worker_process_setup_hook" => string(r, &p, v),
            "py_modules" | "excludes" | "java_jars" => string_list(r, &p, v),
            "pip" | "uv" => packages(r, &p, k, v),
            "conda" => match v {
                Value::String(_) | Value::Object(_) => {}
                _ => wrong(r, &p, "an environment name, a path to environment.yml, or a mapping", v),
            },
            "env_vars" => env_vars(r, &p, v),
            "config" => config(r, &p, v),
            "container" => {
                if !v.is_object() {
                    wrong(r, &p, "a mapping", v);
                }
                r.warning(&p, Code::Ignored, "container is deprecated in Ray; use image_uri");
            }
            "nsight" | "mpi" => {
                if !(v.is_string() || v.is_object()) {
                    wrong(r, &p, "a string or a mapping", v);
                }
            }
            _ => {
                let known: Vec<&str> = FIELDS.iter().map(|(n, _)| *n).collect();
                let hint = crate::decode::suggest(k, &known)
                    .map(|s| format!("; did you mean \"{s}\"?"))
                    .unwrap_or_default();
                r.warning(
                    &p,
                    Code::UnknownRuntimeEnvField,
                    format!("Ray does not know \"{k}\" unless a runtime env plugin provides it{hint}"),
                );
            }
        }
    }
    let has = |k: &str| map.contains_key(k);
    for (a, b) in [("pip", "conda"), ("uv", "conda"), ("pip", "uv")] {
        if has(a) && has(b) {
            r.error(
                field(path, b),
                Code::Conflict,
                format!("Ray does not accept \"{a}\" and \"{b}\" together; put the packages in one of them"),
            );
        }
    }
    if has("image_uri") {
        for k in map.keys().filter(|k| !matches!(k.as_str(), "image_uri" | "config" | "env_vars")) {
            r.error(
                key(path, k),
                Code::Conflict,
                format!("Ray accepts only config and env_vars beside image_uri, not \"{k}\""),
            );
        }
    }
}

fn wrong(r: &mut Report, p: &str, expected: &str, v: &Value) {
    r.error(p, Code::WrongType, format!("must be {expected}, found {}", type_name(v)));
}

fn string(r: &mut Report, p: &str, v: &Value) {
    match v {
        Value::String(s) if !s.is_empty() => {}
        Value::String(_) => r.error(p, Code::Empty, "is empty; give a value or remove the field"),
        _ => wrong(r, p, "a string", v),
    }
}

fn string_list(r: &mut Report, p: &str, v: &Value) {
    let Value::Array(items) = v else {
        return wrong(r, p, "a list of strings", v);
    };
    for (i, item) in items.iter().enumerate() {
        if !item.is_string() {
            wrong(r, &index(p, i), "a string", item);
        }
    }
}

fn packages(r: &mut Report, p: &str, which: &str, v: &Value) {
    match v {
        Value::String(_) => {}
        Value::Array(_) => string_list(r, p, v),
        Value::Object(m) => {
            let version_key = format!("{which}_version");
            let check_key = format!("{which}_check");
            for (k, x) in m {
                let kp = key(p, k);
                match k.as_str() {
                    "packages" => match x {
                        Value::String(_) => {}
                        Value::Array(_) => string_list(r, &kp, x),
                        _ => wrong(r, &kp, "a list of requirements or a requirements file path", x),
                    },
                    k if k == version_key => string(r, &kp, x),
                    k if k == check_key => {
                        if !x.is_boolean() {
                            wrong(r, &kp, "true or false", x);
                        }
                    }
                    "uv_pip_install_options" if which == "uv" => string_list(r, &kp, x),
                    _ => r.error(
                        &kp,
                        Code::UnknownField,
                        format!(
                            "Ray's {which} mapping has packages, {check_key} and {version_key}, not \"{k}\""
                        ),
                    ),
                }
            }
            if !m.contains_key("packages") {
                r.error(
                    field(p, "packages"),
                    Code::Required,
                    format!("the {which} mapping needs \"packages\""),
                );
            }
        }
        _ => wrong(r, p, "a list of requirements, a requirements.txt path, or a mapping", v),
    }
}

fn env_vars(r: &mut Report, p: &str, v: &Value) {
    let Value::Object(m) = v else {
        return wrong(r, p, "a mapping of names to string values", v);
    };
    for (k, x) in m {
        let kp = key(p, k);
        if let Err(why) = crate::grammar::check_env_name(k) {
            r.error(&kp, Code::InvalidName, why);
        }
        if !x.is_string() {
            r.error(
                &kp,
                Code::WrongType,
                format!("Ray needs string values; found {}, so quote it: \"{x}\"", type_name(x)),
            );
        }
    }
}

fn config(r: &mut Report, p: &str, v: &Value) {
    let Value::Object(m) = v else {
        return wrong(r, p, "a mapping", v);
    };
    for (k, x) in m {
        let kp = key(p, k);
        match k.as_str() {
            "setup_timeout_seconds" => match x.as_i64() {
                Some(n) if n == -1 || n > 0 => {}
                _ => r.error(
                    &kp,
                    Code::OutOfRange,
                    "must be a positive number of seconds, or -1 for no timeout",
                ),
            },
            "eager_install" => {
                if !x.is_boolean() {
                    wrong(r, &kp, "true or false", x);
                }
            }
            _ => r.error(
                &kp,
                Code::UnknownField,
                format!("Ray's runtime env config has setup_timeout_seconds and eager_install, not \"{k}\""),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<(String, Code)> {
        let mut r = Report::default();
        check(&mut r, "env", text);
        r.problems.into_iter().map(|p| (p.path, p.code)).collect()
    }

    #[test]
    fn good_runtime_envs_pass() {
        for text in [
            "",
            "pip: [torch==2.3.0, numpy]",
            "pip: {packages: [requests], pip_check: false, pip_version: '==23.0'}",
            "conda: my-env\nenv_vars: {OMP_NUM_THREADS: '4'}\nworking_dir: /mnt/code",
            "image_uri: example.com/ray:2.9\nenv_vars: {A: b}\nconfig: {setup_timeout_seconds: 600, eager_install: true}",
            "uv: {packages: [emoji], uv_check: false}",
        ] {
            assert_eq!(problems(text), [], "{text}");
        }
    }

    #[test]
    fn bad_runtime_envs_are_explained() {
        let check = |text: &str, expected: &[(&str, Code)]| {
            let got = problems(text);
            let want: Vec<(String, Code)> = expected.iter().map(|(p, c)| ((*p).to_owned(), *c)).collect();
            assert_eq!(got, want, "{text}");
        };
        check("[a, b]", &[("env", Code::WrongType)]);
        check("pip: [a]\nconda: x", &[("env.conda", Code::Conflict)]);
        check(
            "env_vars: {A: 1, 'B C': x}",
            &[("env.env_vars.A", Code::WrongType), (r#"env.env_vars["B C"]"#, Code::InvalidName)],
        );
        check("pip: {pip_check: true}", &[("env.pip.packages", Code::Required)]);
        check("working_dri: /x", &[("env.working_dri", Code::UnknownRuntimeEnvField)]);
        check(
            "config: {setup_timeout_seconds: 0}",
            &[("env.config.setup_timeout_seconds", Code::OutOfRange)],
        );
        check("image_uri: x\npip: [a]", &[("env.pip", Code::Conflict)]);
        check("pip: [a\n", &[("env", Code::Syntax)]);
        check("py_modules: [1]", &[("env.py_modules[0]", Code::WrongType)]);
    }
}
