//! What the Kubernetes backend writes to the API server: namespaces, an attempt's objects by server-side
//! apply, deletions by label; and a launch's applies, off the caller's path, with their retries.

use super::*;

impl Inner {
    /// One more request sent (counted for the scale benchmark's requests per admission).
    pub(super) fn sent(&self) {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn jobs(&self, namespace: &str, kind: JobKind) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &views::job_resource(kind))
    }

    pub(super) async fn ensure_namespace(&self, ns: &str) -> Result<(), kube::Error> {
        if self.namespaces.lock().unwrap_or_else(|e| e.into_inner()).contains(ns) {
            return Ok(());
        }
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let body = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {objects::MANAGED_BY_LABEL: objects::MANAGED_BY}},
        });
        self.sent();
        api.patch(ns, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&body)).await?;
        self.namespaces.lock().unwrap_or_else(|e| e.into_inner()).insert(ns.to_owned());
        Ok(())
    }

    /// Makes the PriorityClasses pods name (once per server start; a server-side apply, so that several
    /// servers on one cluster agree on them).
    pub(super) async fn ensure_priority_classes(&self) -> Result<(), kube::Error> {
        use std::sync::atomic::Ordering;
        if self.priority_classes_made.load(Ordering::Acquire) {
            return Ok(());
        }
        let api: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(self.client.clone());
        for o in objects::priority_class_objects() {
            self.sent();
            api.patch(&name_of(&o), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&o)).await?;
        }
        self.priority_classes_made.store(true, Ordering::Release);
        Ok(())
    }

    /// Writes an attempt's objects: its namespace, the job, then the rest (Secrets, the precheck's Service,
    /// a PodGroup) owned by the job, so that they go with it. The job comes first for its uid; its pods are
    /// made by the operator after it, and a pod that finds its Secret missing for a moment waits for it.
    ///
    /// A new object is created (one POST); one that exists already (a launch asked again, a scale) is brought
    /// to what it should be with a server-side apply. Both are idempotent (names come from the attempt), and
    /// creating is several times cheaper for the API server than applying, which builds the managed fields
    /// against the operators' large schemas (kube-bench measures the difference).
    pub(super) async fn apply(
        &self,
        ns: &str,
        objs: &AttemptObjects,
        update: bool,
    ) -> Result<(), kube::Error> {
        let _permit = self.writes.acquire().await.expect("the semaphore is never closed");
        self.ensure_namespace(ns).await?;
        if self.cfg.priority_classes {
            self.ensure_priority_classes().await?;
        }
        let result = self.apply_objects(ns, objs, update).await;
        if let Err(kube::Error::Api(s)) = &result
            && s.code == 404
        {
            // The namespace was deleted under us (with everything in it): made again on the next try.
            self.namespaces.lock().unwrap_or_else(|e| e.into_inner()).remove(ns);
        }
        result
    }

    async fn apply_objects(&self, ns: &str, objs: &AttemptObjects, update: bool) -> Result<(), kube::Error> {
        let job = self.write(ns, &objs.job, update).await?;
        let uid = job.metadata.uid.unwrap_or_default();
        let owner = json!([{
            "apiVersion": objs.job["apiVersion"], "kind": objs.job["kind"],
            "name": name_of(&objs.job), "uid": uid, "blockOwnerDeletion": false,
        }]);
        for o in objs.all().into_iter().filter(|o| !std::ptr::eq(*o, &objs.job)) {
            let mut owned = o.clone();
            owned["metadata"]["ownerReferences"] = owner.clone();
            self.write(ns, &owned, update).await?;
        }
        Ok(())
    }

    /// Creates an object, or (when asked to update, or when it exists) applies it.
    pub(super) async fn write(
        &self,
        ns: &str,
        o: &Value,
        update: bool,
    ) -> Result<DynamicObject, kube::Error> {
        let api = self.api_for(ns, o)?;
        if !update {
            let obj: DynamicObject = serde_json::from_value(o.clone()).map_err(kube::Error::SerdeError)?;
            let pp =
                kube::api::PostParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..Default::default() };
            self.sent();
            match api.create(&pp, &obj).await {
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                other => return other,
            }
        }
        self.sent();
        api.patch(&name_of(o), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(o)).await
    }

    /// An attempt's SSH keys, read back from its Secret (after a restart of the server).
    pub(super) async fn read_ssh_keys(&self, ns: &str, job: &str) -> Result<objects::SshKeys, BackendError> {
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(self.client.clone(), ns);
        let name = objects::ssh_secret_name(job);
        self.sent();
        let secret =
            secrets.get(&name).await.map_err(|e| BackendError(api_error(&format!("reading {name}"), &e)))?;
        let data = secret.data.unwrap_or_default();
        let text = |k: &str| {
            data.get(k)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .ok_or_else(|| BackendError(format!("Secret {name} has no {k}")))
        };
        Ok(objects::SshKeys {
            private_key: text("id_ed25519")?,
            public_key: text("id_ed25519.pub")?,
            host_key: text("host_ed25519")?,
        })
    }

    /// The API of an object, by its apiVersion and kind.
    pub(super) fn api_for(&self, ns: &str, o: &Value) -> Result<Api<DynamicObject>, kube::Error> {
        let (api_version, kind) = (o["apiVersion"].as_str().unwrap_or(""), o["kind"].as_str().unwrap_or(""));
        let plural = match kind {
            "PyTorchJob" => "pytorchjobs",
            "RayJob" => "rayjobs",
            "Secret" => "secrets",
            "Service" => "services",
            "PodGroup" => "podgroups",
            "NetworkPolicy" => "networkpolicies",
            "ConfigMap" => "configmaps",
            other => {
                return Err(kube::Error::Api(Box::new(kube::core::Status {
                    code: 422,
                    reason: "Invalid".into(),
                    message: format!("no resource known for kind {other}"),
                    ..Default::default()
                })));
            }
        };
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let ar = kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(group, version, kind),
            plural,
        );
        Ok(Api::namespaced_with(self.client.clone(), ns, &ar))
    }

    /// Deletes an attempt's job (its pods and Secrets go with it, by owner); `now`: its pods too, selected by
    /// the attempt, without grace (their node is gone, or they never started: nothing would run their hook).
    pub(super) async fn delete(&self, c: &Cleanup) -> Result<(), kube::Error> {
        let _permit = self.writes.acquire().await.expect("the semaphore is never closed");
        self.sent();
        match self.jobs(&c.namespace, c.kind).delete(&c.job_name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
        if c.now {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &c.namespace);
            let dp = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::background() };
            self.sent();
            let selector = objects::attempt_selector(&c.key);
            pods.delete_collection(&dp, &ListParams::default().labels(&selector)).await?;
        }
        Ok(())
    }
}

fn name_of(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}

/// Applies an attempt's objects until they are in, refused, or the tries are spent; says how it ended.
pub(super) async fn launch_in_background(
    inner: Arc<Inner>,
    key: AttemptKey,
    ns: String,
    objs: AttemptObjects,
) {
    let mut wait = Duration::from_secs(1);
    for attempt in 1..=LAUNCH_TRIES {
        if inner.lock().attempts.get(&key).is_none_or(|a| a.stop.is_some()) {
            // Stopped (or forgotten) before its objects were in: nothing more to create.
            let mut s = inner.lock();
            if let Some(a) = s.attempts.get_mut(&key) {
                a.launched = false;
                s.dirty.insert(key);
            }
            return;
        }
        match inner.apply(&ns, &objs, false).await {
            Ok(()) => {
                // A stop that came while the objects were being written may have deleted nothing yet: it is
                // carried out now, so nothing outlives it.
                let stopped = {
                    let s = inner.lock();
                    s.attempts
                        .get(&key)
                        .and_then(|a| Some((a.stop?, a.kind?, a.namespace.clone(), a.job_name.clone())))
                };
                if let Some((cause, kind, namespace, job_name)) = stopped {
                    let c = Cleanup {
                        key: key.clone(),
                        namespace,
                        job_name,
                        kind,
                        now: cause == StopCause::NodeFailed,
                    };
                    if let Err(e) = inner.delete(&c).await {
                        eprintln!(
                            "trainyard: {}",
                            api_error("deleting a job stopped while it was created", &e)
                        );
                        inner.lock().cleanups.push(c);
                    }
                }
                return;
            }
            Err(e) if is_permanent(&e) => {
                let message = api_error("the cluster refused the attempt's objects", &e);
                end_launch(&inner, &key, Reason::UserError, message);
                return;
            }
            Err(e) => {
                let message = api_error(
                    &format!("applying the attempt's objects (try {attempt} of {LAUNCH_TRIES})"),
                    &e,
                );
                inner.lock().out.push(Observation::Note {
                    key: key.clone(),
                    reason: Reason::BackendError,
                    message: message.clone(),
                });
                if attempt == LAUNCH_TRIES {
                    end_launch(&inner, &key, Reason::LaunchFailed, message);
                    return;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// A launch that could not be made: the attempt ends (and what did get created is deleted).
pub(super) fn end_launch(inner: &Inner, key: &AttemptKey, reason: Reason, message: String) {
    let mut s = inner.lock();
    let Some(a) = s.attempts.get_mut(key) else { return };
    if a.sent.finished || a.stop.is_some() {
        a.launched = false;
        s.dirty.insert(key.clone());
        return;
    }
    a.sent.finished = true;
    a.launched = false;
    let cleanup = a.kind.map(|kind| Cleanup {
        key: key.clone(),
        namespace: a.namespace.clone(),
        job_name: a.job_name.clone(),
        kind,
        now: false,
    });
    s.out.push(Observation::Finished { key: key.clone(), reason, message });
    s.cleanups.extend(cleanup);
    s.dirty.insert(key.clone());
}
