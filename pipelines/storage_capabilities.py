"""Whether a StorageClass's provisioner gives ReadWriteMany filesystem volumes, as CDI knows it.

CDI (the Containerized Data Importer of OpenShift Virtualization) keeps a table
of well-known provisioners and the access and volume modes their claims may
have, reading some classes' parameters to tell, say, a vSphere NFS class from a
vSphere block one. This is that table (kubevirt/containerized-data-importer,
pkg/storagecapabilities/storagecapabilities.go: ``CapabilitiesByProvisionerKey``
and ``storageClassToProvisionerKeyMapper``), reduced to the one question the
workspace asks: may a claim be ReadWriteMany with volumeMode Filesystem?
ReadWriteMany only as a raw block device does not count: a pod cannot mount it
as a directory.
"""

from __future__ import annotations

from collections.abc import Mapping

# CDI's provisioner keys whose capabilities include ReadWriteMany Filesystem (True) or do not (False).
RWX_FILESYSTEM_BY_KEY: dict[str, bool] = {
    **dict.fromkeys(
        (
            "nfs.csi.k8s.io",
            "k8s-sigs.io/nfs-subdir-external-provisioner",
            "cephfs.csi.ceph.com",
            "openshift-storage.cephfs.csi.ceph.com",
            "csi-unity.dellemc.com/nfs",
            "csi-vxflexos.dellemc.com/nfs",
            "csi-isilon.dellemc.com",
            "csi-powermax.dellemc.com/nfs",
            "csi-powerstore.dellemc.com/nfs",
            "efs.csi.aws.com",
            "kubernetes.io/azure-file",
            "file.csi.azure.com",
            "spectrumscale.csi.ibm.com",
            "kubernetes.io/portworx-volume/nfs",
            "kubernetes.io/portworx-volume",
            "pxd.portworx.com/nfs",
            "pxd.portworx.com",
            "pxd.portworx.com/pure_fa_file",
            "csi.trident.netapp.io/ontap-nas",
            "csi.trident.netapp.io/gcnv-flex",
            "manila.csi.openstack.org",
            "infinibox-csi-driver/nfs",
            "csi.vsphere.vmware.com/nfs",
            "csi.huawei.com/nfs",
            "driver.longhorn.io/nfs",
        ),
        True,
    ),
    **dict.fromkeys(
        (
            "kubevirt.io.hostpath-provisioner",
            "kubevirt.io/hostpath-provisioner",
            "k8s.io/minikube-hostpath",
            "kubernetes.io/rbd",
            "rbd.csi.ceph.com",
            "rook-ceph.rbd.csi.ceph.com",
            "openshift-storage.rbd.csi.ceph.com",
            "linstor.csi.linbit.com",
            "csi-unity.dellemc.com",
            "csi-vxflexos.dellemc.com",
            "csi-powermax.dellemc.com",
            "csi-powerstore.dellemc.com",
            "kubernetes.io/storageos",
            "storageos",
            "kubernetes.io/aws-ebs",
            "ebs.csi.aws.com",
            "kubernetes.io/azure-disk",
            "disk.csi.azure.com",
            "kubernetes.io/gce-pd",
            "pd.csi.storage.gke.io",
            "hspc.csi.hitachi.com",
            "csi.hpe.com",
            "block.csi.ibm.com",
            "pxd.portworx.com/pure_block",
            "csi.trident.netapp.io/ontap-san",
            "topolvm.cybozu.com",
            "topolvm.io",
            "cinder.csi.openstack.org",
            "csi.ovirt.org",
            "infinibox-csi-driver/iscsiorfibrechannel",
            "infinibox-csi-driver/nvme",
            "csi.vsphere.vmware.com",
            "csi.huawei.com",
            "kubesan.gitlab.io",
            "driver.longhorn.io",
            "driver.longhorn.io/migratable",
            "driver.longhorn.io/fs",
            "blockvolume.csi.oraclecloud.com",
        ),
        False,
    ),
}
# Ceph-CSI drivers are named after the namespace of the operator that runs them (openshift-storage. on ODF,
# rook-ceph. on Rook); CDI lists those two, the suffix covers any other.
CEPH_SUFFIXES = {".cephfs.csi.ceph.com": True, ".rbd.csi.ceph.com": False}
FS_TYPE = "csi.storage.k8s.io/fstype"
NFS_BY_FS_TYPE = ("csi-powerstore.dellemc.com", "csi-vxflexos.dellemc.com", "csi-powermax.dellemc.com")


def provisioner_key(provisioner: str, parameters: Mapping[str, str]) -> str:
    """CDI's ``storageProvisionerKey``: the provisioner, refined by the class parameters CDI reads for it."""
    fs_type = parameters.get(FS_TYPE, "").lower()
    if provisioner == "csi.vsphere.vmware.com":
        return provisioner + ("/nfs" if "nfs" in fs_type else "")
    if provisioner in NFS_BY_FS_TYPE:
        return provisioner + ("/nfs" if fs_type == "nfs" else "")
    if provisioner == "csi-unity.dellemc.com":
        return provisioner + ("/nfs" if parameters.get("protocol", "").lower() == "nfs" else "")
    if provisioner == "csi.huawei.com":
        return provisioner + ("/nfs" if parameters.get("protocol") == "nfs" else "")
    if provisioner == "driver.longhorn.io":
        return _longhorn_key(parameters)
    if provisioner == "csi.trident.netapp.io":
        return _trident_key(parameters)
    if provisioner == "infinibox-csi-driver":
        return _infinidat_key(parameters)
    if provisioner in ("kubernetes.io/portworx-volume", "pxd.portworx.com"):
        return _portworx_key(provisioner, parameters)
    return provisioner


def gives_rwx_filesystem(provisioner: str, parameters: Mapping[str, str]) -> bool | None:
    """True or False as CDI's table says for the class; None when the table does not know it."""
    key = provisioner_key(provisioner, parameters)
    if key in RWX_FILESYSTEM_BY_KEY:
        return RWX_FILESYSTEM_BY_KEY[key]
    for suffix, rwx in CEPH_SUFFIXES.items():
        if key.endswith(suffix):
            return rwx
    return None


def _longhorn_key(parameters: Mapping[str, str]) -> str:
    if parameters.get("migratable") == "true":
        return "driver.longhorn.io/migratable"
    if parameters.get("nfsOptions"):
        return "driver.longhorn.io/nfs"
    if parameters.get("fsType"):
        return "driver.longhorn.io/fs"
    return "driver.longhorn.io"


def _trident_key(parameters: Mapping[str, str]) -> str:
    backend = parameters.get("backendType", "")
    if backend.startswith("ontap-nas"):
        return "csi.trident.netapp.io/ontap-nas"
    if backend.startswith("ontap-san"):
        return "csi.trident.netapp.io/ontap-san"
    selector = [part.strip() for part in parameters.get("selector", "").replace(";", ",").split(",")]
    if backend == "google-cloud-netapp-volumes" and "performance=flex" in selector:
        return "csi.trident.netapp.io/gcnv-flex"
    return "UNKNOWN"


def _infinidat_key(parameters: Mapping[str, str]) -> str:
    protocol = parameters.get("storage_protocol")
    if protocol in ("iscsi", "fc"):
        return "infinibox-csi-driver/iscsiorfibrechannel"
    if protocol == "nvme":
        return "infinibox-csi-driver/nvme"
    if protocol in ("nfs", "nfs_treeq"):
        return "infinibox-csi-driver/nfs"
    return "UNKNOWN"


def _portworx_key(provisioner: str, parameters: Mapping[str, str]) -> str:
    backend = parameters.get("backend") if provisioner == "pxd.portworx.com" else None
    if backend is not None:
        return f"{provisioner}/{backend}" if backend in ("pure_block", "pure_fa_file") else provisioner
    options = parameters.get("sharedv4_mount_options", "").split(",")
    return f"{provisioner}/nfs" if "vers=3.0" in options and "nolock" in options else provisioner
